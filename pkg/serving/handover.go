// Handing the live connections to the next serving process at an upgrade, and taking them on.

package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gzramd/gzramd/pkg/nbddev"
	"github.com/gzramd/gzramd/pkg/supervise"
)

// handedConn is one connection as the handover socket carries it: a flag
// byte (the kernel's: dialed by a serving process to attach the kernel device),
// the export's name with its length before it, and the bytes read from
// the socket beyond the last request.
type handedConn struct {
	kernel  bool
	export  string
	pending []byte
}

func (h handedConn) encode() []byte {
	b := make([]byte, 0, 2+len(h.export)+len(h.pending))
	flag := byte(0)
	if h.kernel {
		flag = 1
	}
	b = append(b, flag, byte(len(h.export)))
	b = append(b, h.export...)
	return append(b, h.pending...)
}

func decodeHanded(b []byte) (handedConn, error) {
	if len(b) < 2 || len(b) < 2+int(b[1]) || b[0] > 1 {
		return handedConn{}, errors.New("malformed handover message")
	}
	n := int(b[1])
	return handedConn{kernel: b[0] == 1, export: string(b[2 : 2+n]), pending: b[2+n:]}, nil
}

// receiveHandover waits for the supervisor's go: at once for a serving
// process started after another ended, for as long as it takes for a
// standby (started ahead, its start-up done, until a serving process
// dies). It returns the handover socket (nil without a supervisor that
// gives one), the live connections the process before handed over, and
// what the supervisor told this process, the go's start environment
// included.
func receiveHandover(start supervise.Started, log *slog.Logger) (*os.File, []supervise.Message, supervise.Started, error) {
	sock, ok := start.HandoverSocket()
	if !ok {
		return nil, nil, start, nil
	}
	standby := start.Standby
	timeout := 10 * time.Second
	if standby {
		log.Info("standby: started ahead and hardened (its heap reserve given back until it takes over); waiting to take over when the serving process ends")
		timeout = 0
		// A terminal's ^C reaches the standby too, but a stop is the
		// supervisor's to tell it: with the go, or by ending it.
		ignored := make(chan os.Signal, 1)
		signal.Notify(ignored, syscall.SIGINT)
		defer signal.Stop(ignored)
	}
	msgs, err := supervise.Receive(sock, timeout)
	start = supervise.FromEnv() // Receive set the start environment
	if standby && !start.Released {
		// No go (which carries the start environment): the socket
		// closed, the supervisor died. The serving process serves on,
		// and the next supervisor starts a standby of its own.
		return nil, nil, start, errors.New("standby: the supervisor died before this process was needed")
	}
	if err != nil {
		log.Warn("the last serving process's connections did not arrive; the kernel device reconnects instead", "err", err)
		return sock, nil, start, nil
	}
	if standby {
		log.Warn("standby: taking over")
	}
	return sock, msgs, start, nil
}

// adoptConnections serves the connections handed over, without a
// handshake: their clients never saw them close. It returns how many are
// the kernel device's.
func (d *daemon) adoptConnections() (kernel int) {
	msgs := d.adopt
	d.adopt = nil
	for _, m := range msgs {
		h, err := decodeHanded(m.Data)
		if err != nil || m.File == nil {
			d.log.Error("a handed-over connection cannot be served; dropping it", "err", err)
			if m.File != nil {
				m.File.Close()
			}
			continue
		}
		nc, err := net.FileConn(m.File)
		m.File.Close()
		if err != nil {
			d.log.Error("a handed-over connection cannot be served; dropping it", "err", err)
			continue
		}
		peer := 0
		if h.kernel {
			peer = os.Getpid() // the kernel's, whoever dialed it: keepConnected counts it
		}
		if err := d.srv.Adopt(d.tracker.Track(nc, peer), h.export, h.pending); err != nil {
			d.log.Error("a handed-over connection cannot be served; dropping it", "err", err)
			nc.Close()
			continue
		}
		if h.kernel {
			kernel++
		}
	}
	if len(msgs) > 0 {
		d.log.Info("serving the connections the last serving process handed over", "connections", len(msgs), "kernel", kernel)
	}
	return kernel
}

// handOverConnections stops serving at a request boundary and sends every
// live connection to the next serving process; without a handover socket
// the connections close (the kernel device then reconnects).
func (d *daemon) handOverConnections(ctx context.Context) error {
	to := d.handover
	if d.handoverTo != nil {
		to = d.handoverTo // an orphan's successor, not through a supervisor
	}
	if to == nil {
		return d.srv.Shutdown(ctx)
	}
	handed, err := d.srv.HandOver(ctx)
	self := os.Getpid()
	sent := 0
	for _, h := range handed {
		m := handedConn{kernel: d.tracker.PeerOf(h.Conn) == self, export: h.Export, pending: h.Pending}
		if serr := supervise.Send(to, supervise.Message{Data: m.encode(), File: h.File}); serr != nil {
			err = errors.Join(err, fmt.Errorf("handing a connection over: %w", serr))
		} else {
			sent++
		}
		h.File.Close()
	}
	if d.handoverTo != nil {
		// The successor takes the state over once this process exits.
		err = errors.Join(err, supervise.SendEnd(to))
	}
	d.log.Info("connections handed over", "connections", sent)
	return err
}

// keptAttached returns the kernel device whose connections were handed
// over to this process: it kept them, and nothing is sent to it.
func (d *daemon) keptAttached(opts nbddev.Options) (*nbddev.Device, error) {
	opts.Index = nbddev.AnyIndex
	return nbddev.FindAttached(opts)
}
