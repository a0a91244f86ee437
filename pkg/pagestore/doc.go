// Package pagestore keeps variable-sized compressed objects (up to one page)
// in slabs carved from large mmap'd arenas outside the Go heap, so millions
// of stored pages cost the garbage collector nothing. Objects are named by
// integer handles that pack size class, slab and slot.
package pagestore
