// Package ublk serves a block device to the kernel through ublk
// (drivers/block/ublk_drv.c): the driver hands each block request to this
// process as the completion of an io_uring command, and takes the result
// back with the next one. There is no socket, and no copy through one, as
// with NBD.
//
// Serve creates a device of a Backend's size (ADD_DEV on
// /dev/ublk-control), sets its parameters (4 KiB blocks, discard and
// write-zeroes in one segment, a volatile cache so that flushes and FUA
// come through), starts one queue per configured count, each on a locked
// OS thread with a ring of its own (internal/uring), and makes the block
// device /dev/ublkbN live once every queue has fetched every tag
// (START_DEV). When its context is done it stops the device (STOP_DEV,
// which lets what is in flight finish), stops the queues and deletes the
// device (DEL_DEV).
//
//	err := ublk.Serve(ctx, ublk.Config{Ready: func(d ublk.Device) { log.Print(d.Block) }}, backend)
//
// Data moves by USER_COPY: the queue's thread preads a write's data from
// /dev/ublkcN, and pwrites a read's, at the position the driver gives the
// request's queue and tag, into and out of the queue's buffer. A
// backend that is a blockdev.WriteReceiver (the device, with a GPU) has
// a write's data read straight into the memory it gives (staging slots),
// as the NBD server reads a payload.
// READ, WRITE (FUA passed on), FLUSH, DISCARD and WRITE_ZEROES (NOUNMAP
// passed on) are served; anything else, and a descriptor out of range, is
// answered with a negative errno, as are the backend's errors (their
// syscall.Errno, else EIO).
//
// # Serving swap
//
// A queue's buffers are mapped and written to before it serves, its
// goroutine's stack grown (stackBytes) and its thread's signal stack made
// resident (the runtime's preemption signal writes its frame there:
// TestSignalStackResident), so that serving a request allocates nothing
// and faults on nothing of the queue's own (TestServeAllocatesNothing):
// with the device as swap, a page allocated while serving may have to be
// reclaimed by writing to the device itself.
// Config.IOFlusher makes each queue's thread an IO flusher. The caller
// must do the rest, as gzramd does for NBD: lock its memory
// (mlockall(MCL_CURRENT|MCL_FUTURE|MCL_ONFAULT); MAP_POPULATE does nothing
// under MCL_ONFAULT, hence the writes), a backend that allocates nothing
// while it serves, and GODEBUG=gcshrinkstackoff=1 if a garbage collection
// must not shrink a queue's stack. Each of these was a hang in the e2e
// guest before it was done (test/e2e/README.md, ublk).
//
// The driver marks a swap request (UBLK_IO_F_SWAP, the kernel's REQ_SWAP).
// The queues serve every request as one: nothing allocated, nothing
// waited for that reclaim could hold, so the flag asks nothing more of
// them, and a device that is not swap loses nothing by it.
//
// # What it needs
//
// Linux 6.5 or later with ublk_drv loaded (modprobe ublk_drv): USER_COPY
// came in 6.5, the ioctl-encoded commands used here in 6.4. Debian 12's
// 6.12 kernel (bookworm-backports, linux-image-6.12-amd64) has it as a
// module; its 6.1 kernel has no USER_COPY. Root, or CAP_SYS_ADMIN: the
// device is not created unprivileged (UBLK_F_UNPRIVILEGED_DEV excludes
// USER_COPY). The kernel's io_uring must be enabled
// (kernel.io_uring_disabled 0, or 1 for a member of its group). Without
// a control device Serve fails with ErrNoDriver.
//
// # Surviving the server's death
//
// A device made with Config.Recoverable outlives its server: when the
// serving process dies (or exits without stopping it), the driver
// quiesces it, holding its requests and requeueing those the dead server
// had taken, and Recover, in another process, serves it again
// (START_USER_RECOVERY, every queue's fetches, END_USER_RECOVERY), from
// the same data: the backend must be memory the dead server shared, as
// gzramd's memfds are. The requests held are sent to it then, and none
// fails (TestRecoverAfterKill, in the 6.12 guest: a write the dead
// server held is sent again, a read sent with no server waits).
//
// Linux 6.12's driver has two hazards here, both met in survive-ublk,
// which kills serving processes inside their takeovers:
//
//   - It says a device is quiesced, and takes START_USER_RECOVERY, before
//     its quiesce work has cancelled the dead server's fetches; fetches
//     sent in between are cancelled too, and the queues stop with the
//     device live (its I/O failed, then its disk was deleted). Recover
//     sleeps 50 ms once the device is quiesced, off the CPU that this
//     process's realtime threads would keep from the work.
//   - A recovering server that dies with some queues ready and others not
//     leaves a device whose next START_USER_RECOVERY puts a NULL task
//     (ublk_queue_reinit: a WARN, then an oops). Every queue fetches at one
//     signal, each in one submission, so the window is microseconds; the
//     descriptors are mapped only after, since the driver lets only the
//     process that mapped them map them again until the next START: a
//     server that dies after START and before any queue fetched leaves a
//     device the next recovers (START then fails EINVAL, and the fetches
//     and END_USER_RECOVERY are taken as they are).
//
// # What it does not do yet
//
//   - Serve the requests of one queue concurrently: a queue's thread runs
//     them one after another, so a slow backend call holds up the queue's
//     others (the other queues go on). The GPU path, which batches, will
//     want requests handed off and committed as they complete.
//   - Clear errors for every bad state. A missing driver, a missing
//     permission and a kernel without USER_COPY (EINVAL at ADD_DEV) are
//     said in words, and Probe checks the first two without making a
//     device; a device made without recovery that a dead server left is
//     deleted by RemoveLeft (gzramd does so as it starts without a
//     supervisor); a Recoverable one is Recovered. A Recoverable device
//     whose state died with its supervisor is left holding its requests.
//
// # Wiring it into the daemon (issue 38)
//
// Done: --transport nbd|ublk|auto picks the kernel device's transport
// (auto: ublk where Probe passes), logged, shown by
// gzramd status and as gzramd_transport_info; with ublk the serving
// process serves the device (pkg/device, as over NBD) with Serve,
// IOFlusher on, makes it swap and removes it at stop. Left:
//
//   - Survival: under the supervisor the daemon serves with
//     Config.Recoverable, tagged with its state's id; the serving process
//     that takes the state over, after a death or at an upgrade (where
//     the one before leaves the device: ErrLeave), finds the device by
//     the tag and Recovers it (test/e2e's survive-ublk).
package ublk
