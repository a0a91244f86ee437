// The handover socket: live connections passed from a serving process to the next, through the supervisor.

package supervise

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// EnvHandover is the descriptor of a serving process's handover socket
// (Config.Handover).
const EnvHandover = "GZRAMD_HANDOVER_FD"

// maxMessage bounds a handover message: a connection's description and
// the bytes read from it beyond its last request.
const maxMessage = 256 << 10

// A Message is what a serving process hands the next: a few bytes of its
// own meaning and at most one descriptor.
type Message struct {
	Data []byte
	File *os.File // nil for none
}

// readyMessage, on the handover socket, says the serving process served:
// its death is no crash at start, and the next starts without backing off.
const readyMessage = "\xffready"

// Ready tells the supervisor the serving process serves (see readyMessage).
func Ready(sock *os.File) error {
	return Send(sock, Message{Data: []byte(readyMessage)})
}

// HandoverSocket returns the serving process's handover socket, if its
// supervisor gave it one.
func (s Started) HandoverSocket() (*os.File, bool) {
	if s.handover < 3 {
		return nil, false
	}
	unix.CloseOnExec(s.handover)
	return os.NewFile(uintptr(s.handover), "handover"), true
}

// Send hands m to the next serving process. The caller keeps m.File, and
// closes it.
func Send(sock *os.File, m Message) error {
	if len(m.Data) == 0 || len(m.Data) > maxMessage {
		return fmt.Errorf("supervise: a handover message of %d bytes: want 1 to %d", len(m.Data), maxMessage)
	}
	var oob []byte
	if m.File != nil {
		oob = unix.UnixRights(int(m.File.Fd()))
	}
	if err := unix.Sendmsg(int(sock.Fd()), m.Data, oob, nil, 0); err != nil {
		return fmt.Errorf("supervise: sending a handover message: %w", err)
	}
	return nil
}

// envMessage starts a message of the supervisor's: the serving process's
// start environment, a variable a line, which Receive sets.
const envMessage = "\xffenv\n"

// Receive returns what the serving process before this one handed over:
// the supervisor ends the list with an empty message, which Receive waits
// for until timeout (0: for ever, as a standby waits). The variables the
// supervisor sends with it (EnvTakeovers, EnvDiedAt, ...) are set in the
// process's environment.
func Receive(sock *os.File, timeout time.Duration) ([]Message, error) {
	fd := int(sock.Fd())
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("supervise: handover socket: %w", err)
	}
	var msgs []Message
	for {
		m, err := recv(fd, 0)
		if err != nil {
			closeAll(msgs)
			return nil, fmt.Errorf("supervise: receiving what the last serving process handed over: %w", err)
		}
		if len(m.Data) == 0 {
			return msgs, nil
		}
		if env, ok := strings.CutPrefix(string(m.Data), envMessage); ok {
			for _, kv := range strings.Split(env, "\n") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					os.Setenv(k, v)
				}
			}
			continue
		}
		msgs = append(msgs, m)
	}
}

// ReceiveOne returns the next message on sock, waiting until timeout.
func ReceiveOne(sock *os.File, timeout time.Duration) (Message, error) {
	fd := int(sock.Fd())
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return Message{}, fmt.Errorf("supervise: handover socket: %w", err)
	}
	return recv(fd, 0)
}

// SendEnd ends a list of messages sent with Send, for a Receive that does
// not go through a supervisor (which ends the list itself).
func SendEnd(sock *os.File) error {
	if err := unix.Sendmsg(int(sock.Fd()), nil, nil, nil, 0); err != nil {
		return fmt.Errorf("supervise: ending the handover: %w", err)
	}
	return nil
}

func recv(fd, flags int) (Message, error) {
	return recvInto(fd, flags, make([]byte, maxMessage), make([]byte, unix.CmsgSpace(4*4)))
}

// recvInto is recv into buf and oob, which the message's Data then is.
func recvInto(fd, flags int, buf, oob []byte) (Message, error) {
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, flags|unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return Message{}, err
	}
	m := Message{Data: buf[:n]}
	if oobn > 0 {
		cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return Message{}, err
		}
		for _, c := range cmsgs {
			fds, err := unix.ParseUnixRights(&c)
			if err != nil {
				continue
			}
			for i, f := range fds {
				if i == 0 && m.File == nil {
					m.File = os.NewFile(uintptr(f), "handed-over")
				} else {
					unix.Close(f)
				}
			}
		}
	}
	return m, nil
}

func closeAll(msgs []Message) {
	for _, m := range msgs {
		if m.File != nil {
			m.File.Close()
		}
	}
}

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
