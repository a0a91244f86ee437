// The zstd codec: pages to standard zstd frames and back, with libzstd.

package codec

import "github.com/DataDog/zstd"

// Zstd is zstd at a fixed level: a better ratio than LZ4 for more CPU. It
// is libzstd compiled from the C sources that github.com/DataDog/zstd
// carries, so building gzramd needs no zstd library.
type Zstd struct {
	level int
	ctxs  chan *zstdCtx
}

// zstdCtx is a libzstd context with the buffer its Compress needs: the
// library writes the worst case's length, more than Codec.Compress's dst
// may hold.
type zstdCtx struct {
	zstd.Ctx
	out []byte
}

// NewZstd returns the zstd codec at the given compression level.
func NewZstd(level int) *Zstd {
	return &Zstd{level: level, ctxs: make(chan *zstdCtx, 64)}
}

// Name implements Codec.
func (*Zstd) Name() string { return "zstd" }

// getCtx returns a pooled context or a new one; putCtx pools it again, or
// leaves it to its finalizer when the pool is full.
func (z *Zstd) getCtx() *zstdCtx {
	select {
	case c := <-z.ctxs:
		return c
	default:
		return &zstdCtx{Ctx: zstd.NewCtx(), out: make([]byte, zstd.CompressBound(PageSize))}
	}
}

func (z *Zstd) putCtx(c *zstdCtx) {
	select {
	case z.ctxs <- c:
	default:
	}
}

// Compress implements Codec.
func (z *Zstd) Compress(dst, src []byte) int {
	if len(src) == 0 || len(dst) == 0 {
		return 0
	}
	c := z.getCtx()
	defer z.putCtx(c)
	out, err := c.CompressLevel(c.out, src, z.level)
	if err != nil || len(out) > len(dst) {
		return 0
	}
	return copy(dst, out)
}

// Decompress implements Codec.
func (z *Zstd) Decompress(dst, src []byte) error {
	if len(src) == 0 || len(dst) == 0 {
		return ErrCorrupt
	}
	c := z.getCtx()
	defer z.putCtx(c)
	n, err := c.DecompressInto(dst, src)
	if err != nil || n != len(dst) {
		return ErrCorrupt
	}
	return nil
}
