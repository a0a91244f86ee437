// The serving process's side of a handover: the messages on its handover
// socket, live connections it sends the next, which receives them, through
// the supervisor (relay.go, the supervisor's side).

package supervise

import (
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
