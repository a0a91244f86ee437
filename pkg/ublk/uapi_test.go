package ublk

import (
	"testing"
	"unsafe"
)

// The values below are include/uapi/linux/ublk_cmd.h's, worked out from
// its _IOR/_IOWR definitions and struct layouts (and the same as
// ublksrv's and libublk-rs's).

func TestCommandEncodings(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"UBLK_U_CMD_GET_DEV_INFO", cmdGetDevInfo, 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", cmdAddDev, 0xc0207504},
		{"UBLK_U_CMD_DEL_DEV", cmdDelDev, 0xc0207505},
		{"UBLK_U_CMD_START_DEV", cmdStartDev, 0xc0207506},
		{"UBLK_U_CMD_STOP_DEV", cmdStopDev, 0xc0207507},
		{"UBLK_U_CMD_SET_PARAMS", cmdSetParams, 0xc0207508},
		{"UBLK_U_CMD_GET_PARAMS", cmdGetParams, 0x80207509},
		{"UBLK_U_CMD_START_USER_RECOVERY", cmdStartUserRecovery, 0xc0207510},
		{"UBLK_U_CMD_END_USER_RECOVERY", cmdEndUserRecovery, 0xc0207511},
		{"UBLK_U_IO_FETCH_REQ", ioFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", ioCommitAndFetchReq, 0xc0107521},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
		// The legacy number is the low byte: the driver switches on it.
		if nr := c.got & 0xff; nr == 0 {
			t.Errorf("%s has no command number", c.name)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"UBLK_F_USER_RECOVERY", FlagUserRecovery, 0x08},
		{"UBLK_F_USER_RECOVERY_REISSUE", FlagUserRecoveryReissue, 0x10},
		{"UBLK_F_UNPRIVILEGED_DEV", FlagUnprivilegedDev, 0x20},
		{"UBLK_F_CMD_IOCTL_ENCODE", FlagCmdIoctlEncode, 0x40},
		{"UBLK_F_USER_COPY", FlagUserCopy, 0x80},
		{"UBLK_IO_F_FUA", ioFlagFUA, 0x2000},
		{"UBLK_IO_F_NOUNMAP", ioFlagNoUnmap, 0x8000},
		{"UBLK_IO_F_SWAP", ioFlagSwap, 0x10000},
		{"UBLK_ATTR_VOLATILE_CACHE", attrVolatileCache, 4},
		{"UBLK_ATTR_FUA", attrFUA, 8},
		{"UBLK_PARAM_TYPE_BASIC", paramTypeBasic, 1},
		{"UBLK_PARAM_TYPE_DISCARD", paramTypeDiscard, 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

func TestStructLayouts(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(struct ublksrv_ctrl_cmd)", unsafe.Sizeof(ctrlCmd{}), ctrlCmdSize},
		{"ublksrv_ctrl_cmd.addr", unsafe.Offsetof(ctrlCmd{}.Addr), 8},
		{"ublksrv_ctrl_cmd.data", unsafe.Offsetof(ctrlCmd{}.Data), 16},
		{"ublksrv_ctrl_cmd.dev_path_len", unsafe.Offsetof(ctrlCmd{}.DevPathLen), 24},
		{"sizeof(struct ublksrv_ctrl_dev_info)", unsafe.Sizeof(ctrlDevInfo{}), 64},
		{"ublksrv_ctrl_dev_info.max_io_buf_bytes", unsafe.Offsetof(ctrlDevInfo{}.MaxIOBufBytes), 8},
		{"ublksrv_ctrl_dev_info.dev_id", unsafe.Offsetof(ctrlDevInfo{}.DevID), 12},
		{"ublksrv_ctrl_dev_info.ublksrv_pid", unsafe.Offsetof(ctrlDevInfo{}.UblksrvPid), 16},
		{"ublksrv_ctrl_dev_info.flags", unsafe.Offsetof(ctrlDevInfo{}.Flags), 24},
		{"ublksrv_ctrl_dev_info.owner_uid", unsafe.Offsetof(ctrlDevInfo{}.OwnerUID), 40},
		{"sizeof(struct ublk_param_basic)", unsafe.Sizeof(paramBasic{}), 32},
		{"ublk_param_basic.max_sectors", unsafe.Offsetof(paramBasic{}.MaxSectors), 8},
		{"ublk_param_basic.dev_sectors", unsafe.Offsetof(paramBasic{}.DevSectors), 16},
		{"sizeof(struct ublk_param_discard)", unsafe.Sizeof(paramDiscard{}), 20},
		{"ublk_param_discard.max_discard_segments", unsafe.Offsetof(paramDiscard{}.MaxDiscardSegments), 16},
		{"ublk_params.basic", unsafe.Offsetof(params{}.Basic), 8},
		{"ublk_params.discard", unsafe.Offsetof(params{}.Discard), 40},
		// The kernel's ublk_params goes on with devt at 60: what is sent
		// ends there.
		{"ublk_params up to devt", unsafe.Offsetof(params{}.Discard) + unsafe.Sizeof(paramDiscard{}), paramsLen},
		{"sizeof(struct ublksrv_io_desc)", unsafe.Sizeof(ioDesc{}), ioDescSize},
		{"ublksrv_io_desc.start_sector", unsafe.Offsetof(ioDesc{}.StartSector), 8},
		{"ublksrv_io_desc.addr", unsafe.Offsetof(ioDesc{}.Addr), 16},
		{"sizeof(struct ublksrv_io_cmd)", unsafe.Sizeof(ioCmd{}), ioCmdSize},
		{"ublksrv_io_cmd.result", unsafe.Offsetof(ioCmd{}.Result), 4},
		{"ublksrv_io_cmd.addr", unsafe.Offsetof(ioCmd{}.Addr), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestUserCopyPos(t *testing.T) {
	// ublk_pos: UBLKSRV_IO_BUF_OFFSET + (qid << UBLK_QID_OFF) +
	// (tag << UBLK_TAG_OFF) + offset, UBLK_QID_OFF = 41, UBLK_TAG_OFF = 25.
	for _, c := range []struct {
		q, tag uint16
		off    uint32
		want   int64
	}{
		{0, 0, 0, 0x80000000},
		{0, 1, 0, 0x80000000 + 1<<25},
		{1, 0, 0, 0x80000000 + 1<<41},
		{3, 63, 4096, 0x80000000 + 3<<41 + 63<<25 + 4096},
		{4095, 4095, 1<<25 - 1, 0x80000000 + 4095<<41 + 4095<<25 + 1<<25 - 1},
	} {
		if got := userCopyPos(c.q, c.tag, c.off); got != c.want {
			t.Errorf("userCopyPos(%d, %d, %d) = %#x, want %#x", c.q, c.tag, c.off, got, c.want)
		}
	}
}

func TestDescAreaSize(t *testing.T) {
	// UBLKSRV_CMD_BUF_OFFSET + q_id * ublk_queue_cmd_buf_size: depth
	// descriptors rounded up to pages.
	for depth, want := range map[int]int{1: 4096, 64: 4096, 170: 4096, 171: 8192, 4096: 98304} {
		if got := descAreaSize(depth); got != want {
			t.Errorf("descAreaSize(%d) = %d, want %d", depth, got, want)
		}
	}
}

func TestDescAreaOffset(t *testing.T) {
	// UBLKSRV_CMD_BUF_OFFSET + q_id * ublk_max_cmd_buf_size(): areas
	// spaced for UBLK_MAX_QUEUE_DEPTH descriptors (4096 * 24 bytes), not
	// the device's depth. With the depth's spacing every queue but the
	// first read queue 0's descriptors (seen in the e2e guest).
	for q, want := range map[uint16]int64{0: 0, 1: 98304, 3: 3 * 98304} {
		if got := descAreaOffset(q); got != want {
			t.Errorf("descAreaOffset(%d) = %d, want %d", q, got, want)
		}
	}
}
