package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// read sends one NBD_CMD_READ and returns the data.
func (c *rawClient) read(off uint64, n int) ([]byte, uint32, error) {
	c.cookie++
	req := make([]byte, 28)
	binary.BigEndian.PutUint32(req[0:], 0x25609513)
	binary.BigEndian.PutUint16(req[6:], uint16(nbd.CmdRead))
	binary.BigEndian.PutUint64(req[8:], c.cookie)
	binary.BigEndian.PutUint64(req[16:], off)
	binary.BigEndian.PutUint32(req[24:], uint32(n))
	if _, err := c.nc.Write(req); err != nil {
		return nil, 0, err
	}
	var rep [16]byte
	if _, err := io.ReadFull(c.nc, rep[:]); err != nil {
		return nil, 0, err
	}
	if errno := binary.BigEndian.Uint32(rep[4:]); errno != 0 {
		return nil, errno, nil
	}
	data := make([]byte, n)
	_, err := io.ReadFull(c.nc, data)
	return data, 0, err
}

// TestServingProcessDiesAndIsReplaced kills the serving process with
// SIGKILL after it acknowledged writes: the supervisor starts another,
// which takes the device's memory over and serves every acknowledged page,
// counts the takeover, and stops in order.
func TestServingProcessDiesAndIsReplaced(t *testing.T) {
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB")...)
	first := d.servingPID()
	if first == d.cmd.Process.Pid {
		t.Fatalf("no serving process under a supervisor:\n%s", d.log.String())
	}
	c := dialRaw(t, d.socket)
	r := rand.New(rand.NewPCG(4, 4))
	const pages = 3008
	data := make([]byte, pages*4096)
	for i := range pages {
		p := data[i*4096 : (i+1)*4096]
		for j := range p[:1024] {
			p[j] = byte(r.Uint32())
		}
	}
	for i := 0; i < pages; i += 8 {
		if errno, err := c.write(uint64(i)*4096, data[i*4096:(i+8)*4096]); err != nil || errno != 0 {
			t.Fatalf("write %d: %v, errno %d", i, err, errno)
		}
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.waitLog(`took the device over from a serving process that died" found="(\d+) pages stored`, 20*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(d.log.String(), "gzramd ready") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second serving process became ready:\n%s", d.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if second := d.servingPID(); second == first {
		t.Fatalf("still the first serving process, %d", first)
	}
	c = dialRaw(t, d.socket)
	for i := 0; i < pages; i += 32 {
		got, errno, err := c.read(uint64(i)*4096, 32*4096)
		if err != nil || errno != 0 {
			t.Fatalf("read %d: %v, errno %d", i, err, errno)
		}
		if !bytes.Equal(got, data[i*4096:(i+32)*4096]) {
			t.Fatalf("pages %d-%d differ after the takeover", i, i+31)
		}
	}
	// The new serving process listens on a port of its own (--metrics
	// 127.0.0.1:0 here).
	urls := regexp.MustCompile(`msg="serving metrics" url=http://([0-9.:]+)/metrics`).FindAllStringSubmatch(d.log.String(), -1)
	d.metrics = urls[len(urls)-1][1]
	f := d.scrape()
	if v, _ := f.Value("gzramd_stored_pages"); v != pages {
		t.Errorf("gzramd_stored_pages = %v after the takeover, want %d", v, pages)
	}
	if v, _ := f.Value("gzramd_takeovers_total"); v != 1 {
		t.Errorf("gzramd_takeovers_total = %v, want 1", v)
	}
	if code := d.stop(sigterm); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
}

// TestSupervisorRealtimeAsServing: the supervisor runs real-time exactly
// when its serving process will (--harden with --realtime on, or auto with
// a kernel device), so that a serving process started after a crash is
// real-time from its first instruction.
func TestSupervisorRealtimeAsServing(t *testing.T) {
	for _, c := range []struct {
		harden   bool
		realtime string
		swap     bool
		want     bool
	}{
		{true, "auto", true, true},
		{true, "auto", false, false},
		{true, "on", false, true},
		{true, "off", true, false},
		{false, "on", true, false},
	} {
		cfg := &serveConfig{harden: c.harden, realtime: c.realtime, swap: c.swap}
		adj := -1000
		opts := supervisorHardening(cfg, &adj)
		if opts.Realtime != c.want {
			t.Errorf("harden=%v realtime=%s swap=%v: supervisor real-time %v, want %v", c.harden, c.realtime, c.swap, opts.Realtime, c.want)
		}
		if opts.Realtime != (cfg.harden && cfg.wantRealtime()) {
			t.Errorf("harden=%v realtime=%s swap=%v: supervisor real-time %v, the serving process %v", c.harden, c.realtime, c.swap, opts.Realtime, cfg.harden && cfg.wantRealtime())
		}
		if opts.LockMemory != c.harden {
			t.Errorf("harden=%v: LockMemory %v", c.harden, opts.LockMemory)
		}
	}
}
