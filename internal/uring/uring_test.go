package uring

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

func newRing(t *testing.T, entries uint32) *Ring {
	t.Helper()
	r, err := New(entries, 0)
	if errors.Is(err, ErrUnsupported) {
		testneeds.Machine(t, "io_uring: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestLayout(t *testing.T) {
	if got := unsafe.Sizeof(params{}); got != 120 {
		t.Errorf("sizeof(io_uring_params) = %d, want 120", got)
	}
	if got := unsafe.Sizeof(CQE{}); got != cqeSize {
		t.Errorf("sizeof(io_uring_cqe) = %d, want %d", got, cqeSize)
	}
	if got := unsafe.Offsetof(params{}.sqOff); got != 40 {
		t.Errorf("offsetof(sq_off) = %d, want 40", got)
	}
	if got := unsafe.Offsetof(params{}.cqOff); got != 80 {
		t.Errorf("offsetof(cq_off) = %d, want 80", got)
	}
}

func TestNops(t *testing.T) {
	r := newRing(t, 4)
	// More than the ring holds at once, to wrap its indexes.
	seen := map[uint64]bool{}
	for round := range 5 {
		for i := range 4 {
			e := r.NextSQE()
			if e == nil {
				t.Fatalf("round %d: no free entry at %d", round, i)
			}
			e.PrepNop(uint64(round*4 + i))
		}
		if r.NextSQE() != nil {
			t.Fatal("a fifth entry in a ring of 4")
		}
		if err := r.Submit(4); err != nil {
			t.Fatal(err)
		}
		r.Reap(func(c CQE) {
			if c.Res != 0 {
				t.Errorf("NOP %d: res %d", c.UserData, c.Res)
			}
			seen[c.UserData] = true
		})
	}
	if len(seen) != 20 {
		t.Errorf("%d distinct completions, want 20", len(seen))
	}
}

func TestPollWakes(t *testing.T) {
	r := newRing(t, 2)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	r.NextSQE().PrepPollAdd(efd, unix.POLLIN, 7)
	if err := r.Submit(0); err != nil {
		t.Fatal(err)
	}
	if r.Ready() != 0 {
		t.Fatal("poll completed before the eventfd was written")
	}
	go func() {
		var one = [8]byte{1}
		unix.Write(efd, one[:])
	}()
	if err := r.Submit(1); err != nil {
		t.Fatal(err)
	}
	r.Reap(func(c CQE) {
		if c.UserData != 7 || c.Res&unix.POLLIN == 0 {
			t.Errorf("completion %+v, want user data 7 with POLLIN", c)
		}
	})
}

func TestUringCmdTooLong(t *testing.T) {
	var e SQE
	if err := e.PrepUringCmd(0, 1, make([]byte, CmdSize+1), 0); err == nil {
		t.Error("a command longer than the entry holds was accepted")
	}
}

func TestUringCmdLayout(t *testing.T) {
	var e SQE
	cmd := []byte{1, 2, 3, 4}
	if err := e.PrepUringCmd(9, 0xc0107520, cmd, 0x1122); err != nil {
		t.Fatal(err)
	}
	if e[0] != OpUringCmd || *(*int32)(unsafe.Pointer(&e[4])) != 9 ||
		*(*uint32)(unsafe.Pointer(&e[8])) != 0xc0107520 || *(*uint64)(unsafe.Pointer(&e[32])) != 0x1122 ||
		e[48] != 1 || e[51] != 4 {
		t.Errorf("entry % x", e[:64])
	}
}
