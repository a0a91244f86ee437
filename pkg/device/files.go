// The files a device keeps its page table and staging area in.

package device

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
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

// mapFiles maps the table and the staging area, making the files when the
// caller gave none; fresh says the table must be empty.
func (d *Device) mapFiles(fresh bool) error {
	if d.cfg.Files != nil {
		if d.cfg.Files.Table == nil || d.cfg.Files.Staging == nil {
			return errors.New("device: Config.Files needs both files")
		}
		d.files = *d.cfg.Files
	} else {
		files, err := NewFiles("gzramd-device")
		if err != nil {
			return err
		}
		d.files, d.ownFiles = files, true
	}
	size := int64(d.pages) * 8
	have, err := d.files.Table.Size()
	switch {
	case err != nil:
		return err
	case fresh && have != 0:
		return fmt.Errorf("device: new device on a table file of %d bytes, not empty (Recover adopts one)", have)
	case !fresh && have != size:
		return fmt.Errorf("device: table file of %d bytes for a device of %d pages (%d bytes)", have, d.pages, size)
	}
	if err := d.files.Table.Grow(size); err != nil {
		return err
	}
	mem, err := d.files.Table.Map(0, int(size))
	if err != nil {
		return err
	}
	// The table is faulted in now, as zram allocates its own up front (8
	// bytes per 4 KiB page, 0.2 % of the device): a swap-out that lands on
	// a never-used part of the device must not fault in a page of table
	// while the kernel is out of free memory.
	memfd.Populate(mem)
	d.table = unsafe.Slice((*entry)(unsafe.Pointer(&mem[0])), d.pages)
	if sc := d.cfg.Staging; sc.Batches > 0 || !fresh {
		n := int64(sc.Batches) * int64(sc.BatchPages) * pageSize
		if have, err := d.files.Staging.Size(); err != nil {
			return err
		} else if !fresh {
			n = max(n, have) // Recover reads what the last device staged
		}
		if n == 0 {
			return nil
		}
		if err := d.files.Staging.Grow(n); err != nil {
			return err
		}
		if d.staging, err = d.files.Staging.Map(0, int(n)); err != nil {
			return err
		}
		if err := d.cfg.Router.RegisterPages(d.staging); err != nil {
			unix.Munmap(d.staging)
			d.staging = nil
			return fmt.Errorf("device: staging: %w", err)
		}
	}
	return nil
}

// unmap undoes mapFiles, and closes the files if the device made them.
func (d *Device) unmap() error {
	var errs []error
	if d.staging != nil {
		if err := d.cfg.Router.UnregisterPages(d.staging); err != nil {
			// Left mapped: the accelerator may still read it.
			errs = append(errs, fmt.Errorf("device: staging memory left mapped: %w", err))
		} else {
			errs = append(errs, unix.Munmap(d.staging))
		}
		d.staging = nil
	}
	if d.table != nil {
		mem := unsafe.Slice((*byte)(unsafe.Pointer(&d.table[0])), len(d.table)*8)
		d.table = nil
		errs = append(errs, unix.Munmap(mem))
	}
	if d.ownFiles {
		errs = append(errs, d.files.Close())
		d.ownFiles = false
	}
	return errors.Join(errs...)
}
