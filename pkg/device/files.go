// The files a device keeps its page table and staging area in.

package device

import (
	"errors"
	"fmt"

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

// mapping is a device's memory in its files: it owns the files, which it
// closes if it made them, and the staging area mapped from its file. The
// table's entries are the page table's (mapEntries); mapping has them
// mapped and unmapped in their turn, after the files and before staging.
type mapping struct {
	files    Files
	ownFiles bool
	staging  []byte // mapped from files.Staging: the staging area's memory
	// router has the staging area registered, for its accelerator.
	router *route.Router
}

// mapFiles maps the entries of t, the table of a device of cfg, and its
// staging area, making the files when cfg gives none; fresh says the
// table must be empty.
func (m *mapping) mapFiles(cfg Config, t *pageTable, fresh bool) error {
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
	if err := t.mapEntries(m.files.Table, fresh); err != nil {
		return err
	}
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
		mem, err := m.files.Staging.Map(0, int(n))
		if err != nil {
			return err
		}
		m.staging = mem
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
func (m *mapping) unmap(t *pageTable) error {
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
	errs = append(errs, t.unmapEntries())
	if m.ownFiles {
		errs = append(errs, m.files.Close())
		m.ownFiles = false
	}
	return errors.Join(errs...)
}
