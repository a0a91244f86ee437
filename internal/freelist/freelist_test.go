package freelist

import (
	"runtime"
	"testing"
)

func TestListKeepsAcrossCollections(t *testing.T) {
	made := 0
	l := New(4, func() *[64]byte { made++; return new([64]byte) })
	l.Fill()
	if made != 4 {
		t.Fatalf("Fill made %d, want 4", made)
	}
	a, b := l.Get(), l.Get()
	l.Put(a)
	l.Put(b)
	runtime.GC()
	runtime.GC()
	for range 4 {
		l.Get()
	}
	if made != 4 {
		t.Errorf("made %d after collections, want the 4 kept", made)
	}
	l.Get()
	if made != 5 {
		t.Errorf("made %d once empty, want 5", made)
	}
	for range 6 {
		l.Put(new([64]byte))
	}
	if n := len(l.free); n != 4 {
		t.Errorf("holds %d after 6 Puts, want its capacity 4", n)
	}
}
