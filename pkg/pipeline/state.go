// The data path's memory in memfds, and the header that says what is in them.

package pipeline

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/pagestore"
)

// State is a data path's memory, kept in memfds so that a process given
// them takes the data path over (Open) after the one that built it died:
// the store's arenas and slab records, the page table, the staging area,
// and a header saying what they hold.
type State struct {
	Header *memfd.File
	Store  pagestore.Files
	Device device.Files
}

// StateFileNames are the names of a State's files, in the order Files
// lists them: what a process handing them on (LISTEN_FDNAMES, a
// supervisor) calls them.
var StateFileNames = []string{"header", "arenas", "slabs", "table", "staging"}

// NewState makes the empty files of a state; name prefixes theirs.
func NewState(name string) (*State, error) {
	files := make([]*memfd.File, len(StateFileNames))
	for i, n := range StateFileNames {
		f, err := memfd.Create(name + "-" + n)
		if err != nil {
			for _, g := range files[:i] {
				g.Close()
			}
			return nil, err
		}
		files[i] = f
	}
	return StateFrom(files)
}

// StateFrom makes a State of files in StateFileNames' order.
func StateFrom(files []*memfd.File) (*State, error) {
	if len(files) != len(StateFileNames) {
		return nil, fmt.Errorf("pipeline: a state is %d files (%v), not %d", len(StateFileNames), StateFileNames, len(files))
	}
	return &State{
		Header: files[0],
		Store:  pagestore.Files{Arenas: files[1], Slabs: files[2]},
		Device: device.Files{Table: files[3], Staging: files[4]},
	}, nil
}

// Files lists the state's files in StateFileNames' order.
func (s *State) Files() []*memfd.File {
	return []*memfd.File{s.Header, s.Store.Arenas, s.Store.Slabs, s.Device.Table, s.Device.Staging}
}

// Close closes the files; the memory goes once no process holds them.
func (s *State) Close() error {
	var errs []error
	for _, f := range s.Files() {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// header is the first bytes of the header file. sealed is written last,
// once everything else in the state is set up: a state without it holds
// nothing acknowledged and is started afresh.
type header struct {
	magic     [8]byte
	version   uint32
	sealed    uint32
	size      int64
	algorithm [8]byte
	arenaSize int64
	id        [16]byte
	created   int64 // unix nanoseconds
	takeovers uint64
}

var stateMagic = [8]byte{'g', 'z', 'r', 'a', 'm', 'd', 's', 't'}

const (
	// stateVersion changes with anything a process taking a state over
	// must agree on: this header, the entries, the store's layout.
	stateVersion = 1
	headerSeal   = 0x5ea1ed
	headerBytes  = 4096
)

// ErrStateLayout reports a state written by a gzramd whose layout this one
// does not read; it is refused, never misread.
var ErrStateLayout = errors.New("pipeline: state of another layout")

// StateInfo is what a state's header says.
type StateInfo struct {
	Sealed    bool // holds a data path (else nothing was acknowledged from it)
	Version   uint32
	Size      int64
	Algorithm string
	ArenaSize int
	ID        string
	Created   time.Time
	Takeovers uint64 // how many times a process took the state over
}

// stateHeader maps the header file, growing it to its size.
func (s *State) mapHeader() (*header, func(), error) {
	if err := s.Header.Grow(headerBytes); err != nil {
		return nil, nil, err
	}
	mem, err := s.Header.Map(0, headerBytes)
	if err != nil {
		return nil, nil, err
	}
	return (*header)(unsafe.Pointer(&mem[0])), func() { unix.Munmap(mem) }, nil
}

// Info reads the header.
func (s *State) Info() (StateInfo, error) {
	h, unmap, err := s.mapHeader()
	if err != nil {
		return StateInfo{}, err
	}
	defer unmap()
	return h.info(), nil
}

func (h *header) info() StateInfo {
	alg := string(h.algorithm[:])
	for i := range h.algorithm {
		if h.algorithm[i] == 0 {
			alg = string(h.algorithm[:i])
			break
		}
	}
	return StateInfo{
		Sealed: atomic.LoadUint32(&h.sealed) == headerSeal, Version: h.version,
		Size: h.size, Algorithm: alg, ArenaSize: int(h.arenaSize),
		ID: fmt.Sprintf("%x", h.id), Created: time.Unix(0, h.created), Takeovers: h.takeovers,
	}
}

// check reports whether a state with this header can serve cfg.
func (h *header) check(cfg *Config) error {
	info := h.info()
	switch {
	case h.magic != stateMagic:
		return fmt.Errorf("pipeline: the state's header is not gzramd's (magic %q): %w", h.magic[:], ErrStateLayout)
	case h.version != stateVersion:
		return fmt.Errorf("pipeline: the state is layout version %d, this gzramd reads version %d; serve it with the gzramd that wrote it, or swapoff first: %w",
			h.version, stateVersion, ErrStateLayout)
	case info.Size != cfg.Size:
		return fmt.Errorf("pipeline: the state holds a device of %d bytes, not the %d asked for; keep the size while swap is on", info.Size, cfg.Size)
	case info.Algorithm != cfg.Algorithm:
		return fmt.Errorf("pipeline: the state's pages are compressed with %s, not %s; keep the algorithm while swap is on", info.Algorithm, cfg.Algorithm)
	}
	return nil
}

// seal writes the header of a state now holding cfg's data path.
func (s *State) seal(cfg *Config, arenaSize int) error {
	h, unmap, err := s.mapHeader()
	if err != nil {
		return err
	}
	defer unmap()
	*h = header{magic: stateMagic, version: stateVersion, size: cfg.Size, arenaSize: int64(arenaSize), created: time.Now().UnixNano()}
	copy(h.algorithm[:], cfg.Algorithm)
	rand.Read(h.id[:])
	atomic.StoreUint32(&h.sealed, headerSeal)
	return nil
}

// reset empties every file of a state that was never sealed (a process
// died while building it): nothing in it was acknowledged.
func (s *State) reset() error {
	for _, f := range s.Files() {
		if err := f.Truncate(); err != nil {
			return err
		}
	}
	return nil
}
