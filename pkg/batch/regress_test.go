package batch

import (
	"context"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/codec"
)

type blockForever struct{ entered chan struct{} }

func (blockForever) Name() string { return "blocked" }
func (b blockForever) CompressBatch(context.Context, *codec.Batch) error {
	b.entered <- struct{}{}
	select {}
}

// The deadline timer's callback broadcasts ready without holding bt.mu; if
// it fires between take()'s deadline check and ready.Wait's enqueue, the
// wakeup is lost and the small batch (and its writer) waits for the next
// page to arrive. A blocked primary batch keeps bt.active at MinPrimaryPages
// so that single-page requests take the batched path, not direct().
func TestDeadlineWakeupIsNotLost(t *testing.T) {
	cpu := codec.NewCPUBatch(codec.NewLZ4(), 1)
	p := page(3)
	trials := 60
	if testing.Short() {
		trials = 10
	}
	for trial := 0; trial < trials; trial++ {
		d := time.Duration(1+trial%40) * time.Microsecond
		prim := blockForever{make(chan struct{}, 1)}
		bt, err := New(prim, cpu, Config{MaxPages: 8, InFlight: 2, MinPrimaryPages: 2, Deadline: d}, nil)
		if err != nil {
			t.Fatal(err)
		}
		go bt.Compress(context.Background(), append(page(1), page(2)...), func(int, []byte) error { return nil })
		<-prim.entered
		for k := 0; k < 100; k++ {
			if !returnsWithin(bt, p, 2*time.Second) {
				t.Fatalf("trial %d/%d (deadline %v): single-page Compress stuck for 2s", trial, k, d)
			}
		}
	}
}

// A panic in commit unwinds out of settle without decrementing
// slot.pending: the slot never returns to the free list. After InFlight+1
// such panics every writer blocks.
func TestPanickingCommitDoesNotLeakSlots(t *testing.T) {
	bt, err := New(codec.NewCPUBatch(codec.NewLZ4(), 1), codec.NewCPUBatch(codec.NewLZ4(), 1), Config{MaxPages: 4, InFlight: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := page(5)
	for i := 0; i < 2; i++ { // InFlight+1 slots
		func() {
			defer func() { recover() }()
			bt.Compress(context.Background(), p, func(int, []byte) error { panic("boom") })
		}()
	}
	if !returnsWithin(bt, p, 2*time.Second) {
		t.Fatal("batcher wedged: every slot leaked by a panicking commit")
	}
}

// returnsWithin reports whether compressing page p returns within d.
func returnsWithin(bt *Batcher, p []byte, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		bt.Compress(context.Background(), p, func(int, []byte) error { return nil })
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}
