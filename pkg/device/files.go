// The files a device keeps its page table and staging area in.

package device

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/pkg/route"
)

// Files are the memfds a device keeps its state in besides the store's, so
// that another process given them takes the device over (Recover).
type Files struct {
	// Table holds the page table: one entry of 8 bytes per page.
	Table *memfd.File
	// Staging holds the write-behind area's pages, which staged entries
	// name by their place in it.
	Staging *memfd.File
}

// NewFiles makes empty files for a device; name prefixes theirs.
func NewFiles(name string) (Files, error) {
	fs, err := memfd.CreateAll(name, "table", "staging")
	if err != nil {
		return Files{}, err
	}
	return Files{Table: fs[0], Staging: fs[1]}, nil
}

// Close closes both files.
func (f Files) Close() error { return memfd.CloseAll(f.Table, f.Staging) }

// mapping is a device's memory in its files: the page table and the
// staging area, mapped, and the files, which it closes if it made them.
type mapping struct {
	files    Files
	ownFiles bool
	table    []entry // mapped from files.Table: no pointers, no GC scanning, faulted in
	staging  []byte  // mapped from files.Staging: the staging area's memory
	// router has the staging area registered, for its accelerator.
	router *route.Router
}

// mapFiles maps the table of a device of cfg, of pages pages, and its
// staging area, making the files when cfg gives none; fresh says the
// table must be empty.
func (m *mapping) mapFiles(cfg Config, pages uint32, fresh bool) error {
	if cfg.Files != nil {
		if cfg.Files.Table == nil || cfg.Files.Staging == nil {
			return errors.New("device: Config.Files needs both files")
		}
		m.files = *cfg.Files
	} else {
		files, err := NewFiles("gzramd-device")
		if err != nil {
			return err
		}
		m.files, m.ownFiles = files, true
	}
	size := int64(pages) * 8
	have, err := m.files.Table.Size()
	switch {
	case err != nil:
		return err
	case fresh && have != 0:
		return fmt.Errorf("device: new device on a table file of %d bytes, not empty (Recover adopts one)", have)
	case !fresh && have != size:
		return fmt.Errorf("device: table file of %d bytes for a device of %d pages (%d bytes)", have, pages, size)
	}
	if err := m.files.Table.Grow(size); err != nil {
		return err
	}
	mem, err := m.files.Table.Map(0, int(size))
	if err != nil {
		return err
	}
	// The table is faulted in now, as zram allocates its own up front (8
	// bytes per 4 KiB page, 0.2 % of the device): a swap-out that lands on
	// a never-used part of the device must not fault in a page of table
	// while the kernel is out of free memory.
	memfd.Populate(mem)
	m.table = unsafe.Slice((*entry)(unsafe.Pointer(&mem[0])), pages)
	if sc := cfg.Staging; sc.Batches > 0 || !fresh {
		n := int64(sc.Batches) * int64(sc.BatchPages) * pageSize
		if have, err := m.files.Staging.Size(); err != nil {
			return err
		} else if !fresh {
			n = max(n, have) // Recover reads what the last device staged
		}
		if n == 0 {
			return nil
		}
		if err := m.files.Staging.Grow(n); err != nil {
			return err
		}
		if m.staging, err = m.files.Staging.Map(0, int(n)); err != nil {
			return err
		}
		if err := cfg.Router.RegisterPages(m.staging); err != nil {
			unix.Munmap(m.staging)
			m.staging = nil
			return fmt.Errorf("device: staging: %w", err)
		}
		m.router = cfg.Router
	}
	return nil
}

// unmap undoes mapFiles, and closes the files if it made them.
func (m *mapping) unmap() error {
	var errs []error
	if m.staging != nil {
		if err := m.router.UnregisterPages(m.staging); err != nil {
			// Left mapped: the accelerator may still read it.
			errs = append(errs, fmt.Errorf("device: staging memory left mapped: %w", err))
		} else {
			errs = append(errs, unix.Munmap(m.staging))
		}
		m.staging = nil
	}
	if m.table != nil {
		mem := unsafe.Slice((*byte)(unsafe.Pointer(&m.table[0])), len(m.table)*8)
		m.table = nil
		errs = append(errs, unix.Munmap(mem))
	}
	if m.ownFiles {
		errs = append(errs, m.files.Close())
		m.ownFiles = false
	}
	return errors.Join(errs...)
}
