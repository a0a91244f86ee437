package nbd

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"

	"github.com/gzramd/gzramd/pkg/nbd/nbdtest"
)

// Negotiate against nbdkit, the reference C server.
func TestNegotiateWithNbdkit(t *testing.T) {
	testneeds.Command(t, "nbdkit", "nbdkit")
	sock := filepath.Join(t.TempDir(), "nbdkit.sock")
	cmd := exec.Command("nbdkit", "-f", "-U", sock, "-e", "kit", "memory", "3M")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// nbdkit binds the socket before it listens on it: until it does, a
	// dial finds no socket or is refused.
	var nc net.Conn
	var info ExportInfo
	var err error
	for {
		nc, info, err = Dial(ctx, "unix", sock, "kit")
		if err == nil || ctx.Err() != nil || !(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist)) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if info.Size != 3<<20 || info.Flags&FlagHasFlags == 0 || info.Flags&FlagSendFlush == 0 {
		t.Fatalf("negotiated %+v", info)
	}
	// The connection is in transmission: a write and a read work.
	c := &rawClient{t: t, nc: nc, info: info}
	c.roundTrip(4096)
}

// A server without NBD_OPT_GO gets NBD_OPT_EXPORT_NAME instead.
func TestNegotiateFallsBackToExportName(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	errc := make(chan error, 1)
	go func() {
		defer server.Close()
		errc <- func() error {
			var g [18]byte
			be.PutUint64(g[0:], magicInit)
			be.PutUint64(g[8:], magicOption)
			be.PutUint16(g[16:], flagFixedNewstyle) // no NO_ZEROES
			if _, err := server.Write(g[:]); err != nil {
				return err
			}
			var cf [4]byte
			if _, err := io.ReadFull(server, cf[:]); err != nil {
				return err
			}
			if be.Uint32(cf[:]) != clientFlagFixed {
				return errors.New("client asked for no zeroes the server did not offer")
			}
			for {
				var oh [16]byte
				if _, err := io.ReadFull(server, oh[:]); err != nil {
					return err
				}
				opt, n := be.Uint32(oh[8:]), be.Uint32(oh[12:])
				data := make([]byte, n)
				if _, err := io.ReadFull(server, data); err != nil {
					return err
				}
				if opt == optGo {
					r := be.AppendUint64(nil, magicOptionReply)
					r = be.AppendUint32(r, optGo)
					r = be.AppendUint32(r, repErrUnsup)
					r = be.AppendUint32(r, 0)
					if _, err := server.Write(r); err != nil {
						return err
					}
					continue
				}
				if opt != optExportName || string(data) != "old" {
					return errors.New("expected NBD_OPT_EXPORT_NAME old")
				}
				reply := make([]byte, 134)
				be.PutUint64(reply, 1<<20)
				be.PutUint16(reply[8:], FlagHasFlags|FlagSendFlush)
				_, err := server.Write(reply)
				return err
			}
		}()
	}()
	info, err := Negotiate(client, "old")
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 1<<20 || info.Flags != FlagHasFlags|FlagSendFlush {
		t.Fatalf("negotiated %+v", info)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// Negotiate reports a refused export with the server's reply.
func TestNegotiateUnknownExport(t *testing.T) {
	ts := startServer(t, []Export{{Name: "d", Backend: nbdtest.NewMemBackend(4096)}}, Options{})
	_, _, err := Dial(context.Background(), "unix", ts.sock, "nosuch")
	var oe *OptionError
	if !errors.As(err, &oe) || oe.Reply != repErrUnknown || oe.Message == "" {
		t.Fatalf("Dial of unknown export: %v", err)
	}
}
