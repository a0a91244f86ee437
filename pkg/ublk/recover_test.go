package ublk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/memfd"
)

// recoverChildEnv makes the test binary, run again, the server that
// TestRecoverAfterKill kills.
const recoverChildEnv = "GZRAMD_UBLK_RECOVER_CHILD"

const (
	recoverTag  = 0x6772616d64 // the child's Config.Tag
	recoverSize = 16 << 20
	// A write of the block at trapAt hangs in the child's backend, as a
	// request the server held when it died.
	trapAt = recoverSize - 4096
)

// trapBackend is a memBackend whose writes to trapAt never return: it
// says so on trapped, once.
type trapBackend struct {
	*memBackend
	trapped *os.File
}

func (b trapBackend) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	if off <= trapAt && trapAt < off+int64(len(p)) {
		b.trapped.WriteString("trapped\n")
		select {}
	}
	return b.memBackend.WriteAt(ctx, p, off, fua)
}

// leftChild serves a device made without recovery, tagged leftTag, and
// says its id on descriptor 3; it serves until it is killed.
func leftChild() {
	out := os.NewFile(3, "parent")
	cfg := Config{Queues: 1, Tag: leftTag, Ready: func(d Device) { out.WriteString(strconv.Itoa(d.ID) + "\n") }}
	err := Serve(context.Background(), cfg, newMemBackend(4<<20))
	os.Stderr.WriteString("left child: Serve returned: " + fmt.Sprint(err) + "\n")
	os.Exit(2)
}

// leftTag is leftChild's Config.Tag.
const leftTag = 0x6c656674

// TestRemoveLeft kills the server of a device made without recovery (this
// binary run again): the driver stops the device, and keeps it until
// deleted. RemoveLeft deletes it, and leaves alone a live device of the
// same tag and one of another tag.
func TestRemoveLeft(t *testing.T) {
	if os.Getenv(recoverChildEnv) == "left" {
		leftChild()
		return
	}
	needDriver(t)
	live := serveMem(t, Config{Tag: leftTag}, 4<<20)
	other := serveMem(t, Config{Tag: leftTag + 1}, 4<<20)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	child := exec.Command(os.Args[0], "-test.run=^TestRemoveLeft$")
	child.Env = append(os.Environ(), recoverChildEnv+"=left")
	child.ExtraFiles = []*os.File{w}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("the serving child said nothing: %v", err)
	}
	id, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the serving child said %q", line)
	}
	child.Process.Kill()
	child.Wait()
	// The driver stops the dead server's device (its stop work) a
	// moment after the server's end.
	deadline := time.Now().Add(10 * time.Second)
	var removed []int
	for {
		removed, err = RemoveLeft("", leftTag)
		if err != nil || len(removed) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || len(removed) != 1 || removed[0] != id {
		state := "not readable"
		if ctl, cerr := openControl(DefaultControlPath); cerr == nil {
			info, ierr := ctl.devInfo(uint32(id))
			state = fmt.Sprintf("%s, server pid %d, flags %#x, tag %#x (%v)", stateName(info.State), info.UblksrvPid, info.Flags, info.UblksrvFlags, ierr)
			ctl.Close()
		}
		t.Fatalf("RemoveLeft: %v, %v; want [%d], the dead child's, which is %s", removed, err, id, state)
	}
	if _, err := os.Stat("/sys/class/ublk-char/ublkc" + strconv.Itoa(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ublkc%d after RemoveLeft: %v, want it gone", id, err)
	}
	for _, s := range []*served{live, other} {
		if _, err := os.Stat(s.dev.Block); err != nil {
			t.Errorf("%s, which RemoveLeft must leave: %v", s.dev.Block, err)
		}
	}
}

// recoverChild serves a Recoverable device over the memfd it inherits
// (descriptor 3), with writes to trapAt held for ever, and says its id on
// descriptor 4; it serves until it is killed.
func recoverChild() {
	fail := func(err error) {
		os.Stderr.WriteString("recover child: " + err.Error() + "\n")
		os.Exit(2)
	}
	f, err := memfd.Open(3)
	if err != nil {
		fail(err)
	}
	mem, err := f.Map(0, recoverSize)
	if err != nil {
		fail(err)
	}
	out := os.NewFile(4, "parent")
	b := trapBackend{&memBackend{data: mem, failAt: -1}, out}
	cfg := Config{Recoverable: true, Queues: 1, Tag: recoverTag, Ready: func(d Device) { out.WriteString(strconv.Itoa(d.ID) + "\n") }}
	fail(errors.Join(errors.New("Serve returned"), Serve(context.Background(), cfg, b)))
}

// startChild begins the recovery of device GZRAMD_UBLK_RECOVER_ID, as
// Recover does up to its queues' fetches (START_USER_RECOVERY, the char
// device opened), says "started" and waits to be killed.
func startChild() {
	fail := func(err error) {
		os.Stderr.WriteString("start child: " + err.Error() + "\n")
		os.Exit(2)
	}
	id, err := strconv.Atoi(os.Getenv("GZRAMD_UBLK_RECOVER_ID"))
	if err != nil {
		fail(err)
	}
	ctl, err := openControl(DefaultControlPath)
	if err != nil {
		fail(err)
	}
	if _, err := quiescedDevice(ctl, uint32(id)); err != nil {
		fail(err)
	}
	if err := startRecovery(ctl, uint32(id)); err != nil {
		fail(err)
	}
	char, err := openChar(fmt.Sprintf("/dev/ublkc%d", id))
	if err != nil {
		fail(err)
	}
	defer char.Close()
	os.Stdout.WriteString("started\n")
	time.Sleep(time.Hour)
}

// TestRecoverAfterKill serves a Recoverable device from another process
// (this binary run again) over a memfd both map, writes through it, and
// kills that process while it holds a write; a read sent then waits.
// Recover, here, serves the device again from the same memfd: the held
// write is sent again and succeeds, the waiting read gets its data, and
// everything written before reads back. No request fails, which for swap
// is no process killed. Between the kill and Recover, another process
// begins a recovery and is killed before its queues fetch: Recover takes
// the device from there.
func TestRecoverAfterKill(t *testing.T) {
	switch os.Getenv(recoverChildEnv) {
	case "1":
		recoverChild()
		return
	case "start":
		startChild()
		return
	}
	needDriver(t)
	f, err := memfd.Create("ublk-recover")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Grow(recoverSize); err != nil {
		t.Fatal(err)
	}
	mem, err := f.Map(0, recoverSize)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	child := exec.Command(os.Args[0], "-test.run=^TestRecoverAfterKill$")
	child.Env = append(os.Environ(), recoverChildEnv+"=1")
	child.ExtraFiles = []*os.File{f.OSFile(), w}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	killed := false
	defer func() {
		if !killed {
			child.Process.Kill()
			child.Wait()
		}
	}()
	lines := bufio.NewReader(r)
	line, err := lines.ReadString('\n')
	if err != nil {
		t.Fatalf("the serving child said nothing: %v", err)
	}
	id, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the serving child said %q", line)
	}
	block := "/dev/ublkb" + strconv.Itoa(id)
	t.Logf("pid %d serves %s", child.Process.Pid, block)
	dev := openDirect(t, block)

	data := alignedBuf(t, 1<<20)
	copy(data, pattern(len(data), 3))
	if _, err := dev.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	held := alignedBuf(t, 4096)
	copy(held, pattern(4096, 9))
	heldErr := make(chan error, 1)
	go func() {
		_, err := dev.WriteAt(held, trapAt)
		heldErr <- err
	}()
	if line, err := lines.ReadString('\n'); err != nil || line != "trapped\n" {
		t.Fatalf("the write at %d did not reach the child: %q, %v", trapAt, line, err)
	}

	child.Process.Kill()
	child.Wait()
	killed = true
	// A read sent while the device has no server waits for the next.
	got := alignedBuf(t, 64<<10)
	readErr := make(chan error, 1)
	go func() {
		_, err := dev.ReadAt(got, 0)
		readErr <- err
	}()
	select {
	case err := <-readErr:
		t.Fatalf("a read with no server returned %v, want it held", err)
	case err := <-heldErr:
		t.Fatalf("the held write returned %v with no server, want it held", err)
	case <-time.After(200 * time.Millisecond):
	}

	// A recovery that dies after its START_USER_RECOVERY and before its
	// queues fetched does not keep the device from the next.
	half := exec.Command(os.Args[0], "-test.run=^TestRecoverAfterKill$")
	half.Env = append(os.Environ(), recoverChildEnv+"=start", "GZRAMD_UBLK_RECOVER_ID="+strconv.Itoa(id))
	half.Stderr = os.Stderr
	hr, err := half.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := half.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(hr).ReadString('\n'); err != nil || line != "started\n" {
		half.Process.Kill()
		half.Wait()
		t.Fatalf("the recovery begun in another process: %q, %v", line, err)
	}
	half.Process.Kill()
	half.Wait()

	if found, quiesced, err := Find("", recoverTag); err != nil || found != id {
		t.Fatalf("Find(%#x): device %d (quiesced %v), %v; want %d", recoverTag, found, quiesced, err, id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Device, 1)
	served := make(chan error, 1)
	cfg := Config{Ready: func(d Device) { ready <- d }}
	go func() { served <- Recover(ctx, cfg, id, &memBackend{data: mem, failAt: -1}) }()
	select {
	case d := <-ready:
		t.Logf("recovered %s: %d queue(s) of depth %d, flags %#x", d.Block, d.Queues, d.Depth, d.Flags)
	case err := <-served:
		t.Fatalf("Recover: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not recovered after 30 s")
	}
	for name, c := range map[string]chan error{"held write": heldErr, "read": readErr} {
		select {
		case err := <-c:
			if err != nil {
				t.Errorf("the %s failed: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the %s has not returned 10 s after the recovery", name)
		}
	}
	if !bytes.Equal(got, data[:len(got)]) {
		t.Error("the read held over the recovery returned other data")
	}
	if !bytes.Equal(mem[trapAt:trapAt+4096], held) {
		t.Error("the held write is not in the backend after the recovery")
	}
	all := alignedBuf(t, len(data))
	if _, err := dev.ReadAt(all, 0); err != nil || !bytes.Equal(all, data) {
		t.Errorf("what was written before the kill reads back otherwise (%v)", err)
	}
	dev.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Recover after a stop: %v", err)
	}
	if _, err := os.Stat(block); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Recover returned: %v, want it gone", block, err)
	}
}

// TestRecoverRefuses asks Recover for a device made without recovery and
// for one that does not exist: each is refused at once, saying why, and
// the first goes on serving.
func TestRecoverRefuses(t *testing.T) {
	needDriver(t)
	s := serveMem(t, Config{}, 4<<20)
	err := Recover(context.Background(), Config{}, s.dev.ID, newMemBackend(4<<20))
	if err == nil || !strings.Contains(err.Error(), "not made to be recovered") {
		t.Errorf("Recover of a device made without recovery: %v", err)
	}
	f := openDirect(t, s.dev.Block)
	buf := alignedBuf(t, 4096)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Errorf("the device after the refusal: %v", err)
	}
	err = Recover(context.Background(), Config{}, 1<<20-1, newMemBackend(4<<20))
	if err == nil || !errors.Is(err, syscall.ENODEV) {
		t.Errorf("Recover of no device: %v, want ENODEV", err)
	}
}

// TestLeaveAndRecover leaves a Recoverable device, as a server handing it
// over at an upgrade does (ErrLeave), and recovers it in the same
// process: the device stays, found by its tag and quiesced, a read sent
// meanwhile waits, and after the recovery it returns what was written
// before the leave.
func TestLeaveAndRecover(t *testing.T) {
	needDriver(t)
	const size = 8 << 20
	tag := rand.Uint64() | 1
	m := newMemBackend(size)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ready := make(chan Device, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- Serve(ctx, Config{Recoverable: true, Tag: tag, Ready: func(d Device) { ready <- d }}, m)
	}()
	var d Device
	select {
	case d = <-ready:
	case err := <-errc:
		t.Fatalf("Serve: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no device after 60 s")
	}
	f := openDirect(t, d.Block)
	data := alignedBuf(t, 256<<10)
	copy(data, pattern(len(data), 5))
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	cancel(ErrLeave)
	if err := <-errc; err != nil {
		t.Fatalf("Serve, leaving: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		id, quiesced, err := Find("", tag)
		if err != nil || id != d.ID {
			t.Fatalf("Find(%#x) after the leave: device %d, %v; want %d", tag, id, err, d.ID)
		}
		if quiesced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the device left is not quiesced after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := alignedBuf(t, len(data))
	readErr := make(chan error, 1)
	go func() {
		_, err := f.ReadAt(got, 0)
		readErr <- err
	}()
	select {
	case err := <-readErr:
		t.Fatalf("a read of the device left returned %v, want it held", err)
	case <-time.After(200 * time.Millisecond):
	}
	rctx, rcancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Recover(rctx, Config{Ready: func(d Device) { ready <- d }}, d.ID, m) }()
	select {
	case <-ready:
	case err := <-served:
		t.Fatalf("Recover: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not recovered after 30 s")
	}
	select {
	case err := <-readErr:
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("the read held over the recovery: %v, same data %v", err, bytes.Equal(got, data))
		}
	case <-time.After(10 * time.Second):
		t.Error("the read held has not returned 10 s after the recovery")
	}
	f.Close()
	rcancel()
	if err := <-served; err != nil {
		t.Errorf("Recover after a stop: %v", err)
	}
	if _, _, err := Find("", tag); !errors.Is(err, ErrNotFound) {
		t.Errorf("Find(%#x) after the stop: %v, want ErrNotFound", tag, err)
	}
}
