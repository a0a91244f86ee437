// Package prefetch asks the CPU to bring memory into its caches ahead of
// use, so that a cache miss known to come overlaps other work.
package prefetch
