// Package ublk serves a block device to the kernel through ublk
// (drivers/block/ublk_drv.c): the driver hands each block request to this
// process as the completion of an io_uring command, and takes the
// result back with the next one. There is no socket and no copy through
// one, as NBD has.
//
// Serve creates a device of a Backend's size (ADD_DEV on
// /dev/ublk-control), sets its parameters (4 KiB blocks, discard and
// write-zeroes in one segment, a volatile cache so that flushes come
// through), starts one queue per configured count, each on a locked OS
// thread with a ring of its own (internal/uring), and makes the block
// device /dev/ublkbN live once every queue has fetched every tag
// (START_DEV). On cancellation it stops the device, which finishes what
// is in flight, stops the queues and deletes the device.
//
// Data moves by USER_COPY: the queue's thread preads a write's data from
// /dev/ublkcN, and pwrites a read's, at the position the driver gives
// the request's queue and tag, into and out of a buffer of its own per
// tag, mapped when the queue opens. Serving a request allocates nothing.
// READ, WRITE (FUA passed on), FLUSH, DISCARD and WRITE_ZEROES (NOUNMAP
// passed on) are served; anything else, and a descriptor out of range,
// is answered with a negative errno, as are the backend's errors.
//
// # What it needs
//
// Linux 6.5 or later with ublk_drv loaded (modprobe ublk_drv): USER_COPY
// came in 6.5, the ioctl-encoded commands used here in 6.4. Debian 12's
// 6.12 kernel (bookworm-backports, linux-image-6.12-amd64) has it as a
// module; its 6.1 kernel has no USER_COPY. Root, or CAP_SYS_ADMIN: the
// device is not created unprivileged (UBLK_F_UNPRIVILEGED_DEV excludes
// USER_COPY). The kernel's io_uring must be enabled
// (kernel.io_uring_disabled 0, or 1 for a member of its group).
//
// # What it does not do yet
//
//   - Survive its own death: the device is created without
//     UBLK_F_USER_RECOVERY, so a dead server's device fails its I/O and
//     goes. The commands for a takeover (START_USER_RECOVERY,
//     END_USER_RECOVERY) are here, unused.
//   - Serve the daemon: gzramd serve still attaches NBD devices only.
//   - Lock its memory or run as the kernel's IO flusher: a caller serving
//     swap must (mlockall, PR_SET_IO_FLUSHER), as gzramd does for NBD.
//   - Take writes into the backend's own memory (nbd.WriteReceiver's
//     counterpart): each request's data passes through the tag's buffer.
//   - Serve requests of one queue concurrently: a queue's thread runs its
//     requests one after another, so a slow backend call holds up the
//     queue's others (the other queues go on).
package ublk
