// Waiting for the kernel's receive workers of dead connections to end.

package nbddev

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A connection the kernel found dead by a failed send or a request
// timeout keeps its receive worker until that worker's read of the old
// socket fails, and the worker reads its connection's socket afresh each
// time round its loop, and again for a reply's data (drivers/block/nbd.c:
// recv_work reads nsock->sock, nbd_handle_reply reads
// config->socks[index]->sock). A worker that is still handing the kernel
// replies the dead server left in the old socket when a new socket is put
// into its connection then reads the new socket beside the new worker:
// each takes bytes of the other's replies, and a read completes with
// bytes of another reply. It was seen once (Linux 6.1, survive with zstd
// beside two busy loops): "Wrong magic" on both connections, and a
// swapped-in page whose bytes were 16 bytes off, the length of a reply's
// header. So a takeover offers sockets only once no more receive workers
// run than connections stay alive.
//
// A workqueue worker's comm names the workqueue of the item it runs, after
// a "+" while it runs one (wq_worker_comm, Linux 4.18 on), the workqueue's
// rescuer too: the device's receive workers are those named
// "...+nbdN-recv" (Debian's 6.1 names them so: "kworker/u5:1+nbd0-recv",
// and "nbd0-recv+nbd0-recv" for the rescuer) or "...+knbdN-recv" (as
// some kernels name the workqueue). Kernels that name workers otherwise
// show none, and nothing waits.

// staleWorkerWait bounds the wait for receive workers of dead connections.
// A worker blocked reading an old socket that nobody will write is
// harmless, and it ends once the kernel shuts that socket down; one that
// runs longer than this under load is waited for no more, and the wait is
// reported (Device.StaleWorkers).
const staleWorkerWait = 5 * time.Second

// recvWorkers counts the running receive workers of /dev/nbd<index>,
// among the kernel's threads: kthreadd's children where the kernel lists
// them, every process otherwise.
func (o *Options) recvWorkers(index int) int {
	proc := o.Proc
	if proc == "" {
		proc = "/proc"
	}
	name := "nbd" + strconv.Itoa(index) + "-recv"
	var pids []string
	if b, err := os.ReadFile(filepath.Join(proc, "2", "task", "2", "children")); err == nil {
		pids = strings.Fields(string(b))
	} else if entries, err := os.ReadDir(proc); err == nil {
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				pids = append(pids, e.Name())
			}
		}
	}
	n := 0
	for _, pid := range pids {
		comm, err := os.ReadFile(filepath.Join(proc, pid, "comm"))
		c := strings.TrimSpace(string(comm))
		if err == nil && (strings.HasSuffix(c, "+"+name) || strings.HasSuffix(c, "+k"+name)) {
			n++
		}
	}
	return n
}

// waitStaleWorkers waits until at most alive receive workers of the device
// run, polling, for at most staleWorkerWait or until ctx ends. It returns
// how long it waited and how many workers were left beyond alive.
func (d *Device) waitStaleWorkers(ctx context.Context, alive int) (time.Duration, int) {
	start := time.Now()
	poll := time.Millisecond
	for {
		extra := d.opts.recvWorkers(d.Index) - alive
		if extra <= 0 || time.Since(start) >= staleWorkerWait {
			return time.Since(start), max(extra, 0)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), extra
		case <-time.After(poll):
		}
		poll = min(2*poll, 20*time.Millisecond)
	}
}
