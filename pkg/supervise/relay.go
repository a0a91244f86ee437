// The supervisor's side of a handover: it relays what one serving process
// sends on its handover socket to the next.

package supervise

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// handoverPair is one serving process's handover socket: the child's end
// (its descriptor) and the supervisor's.
type handoverPair struct {
	child, mine *os.File
	ready       bool // the serving process said it served (taken)
	oob         []byte
}

func newHandoverPair() (*handoverPair, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("supervise: handover socket: %w", err)
	}
	return &handoverPair{child: os.NewFile(uintptr(fds[0]), "handover"), mine: os.NewFile(uintptr(fds[1]), "handover"),
		oob: make([]byte, unix.CmsgSpace(4*4))}, nil
}

// taken returns what the serving process on p sent before it ended,
// without waiting. With scratch (maxMessage bytes), it returns nothing:
// it closes what came, read into scratch, as after a death, when nothing
// that came is needed and nothing is to be allocated (see dying).
func (p *handoverPair) taken(scratch []byte) []Message {
	if scratch != nil {
		for {
			m, err := recvInto(int(p.mine.Fd()), unix.MSG_DONTWAIT, scratch[:maxMessage], p.oob)
			if err != nil || len(m.Data) == 0 {
				return nil
			}
			if m.File != nil {
				m.File.Close()
			}
			if string(m.Data) == readyMessage {
				p.ready = true
			}
		}
	}
	var msgs []Message
	for {
		m, err := recv(int(p.mine.Fd()), unix.MSG_DONTWAIT)
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) {
				closeAll(msgs)
				return nil
			}
			return msgs
		}
		if len(m.Data) == 0 {
			return msgs // the serving process's end is closed
		}
		if string(m.Data) == readyMessage {
			p.ready = true
			continue
		}
		msgs = append(msgs, m)
	}
}

// give sends msgs, then the empty message that ends them, to the serving
// process on p; it blocks while that process has not read them.
func (p *handoverPair) give(msgs []Message) error {
	defer closeAll(msgs)
	for _, m := range msgs {
		if err := Send(p.mine, m); err != nil {
			return err
		}
	}
	return SendEnd(p.mine)
}

func (p *handoverPair) close() {
	p.child.Close()
	p.mine.Close()
}
