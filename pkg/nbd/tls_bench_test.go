package nbd

import (
	"fmt"
	"testing"
)

// BenchmarkRequestsTLS is BenchmarkRequests over loopback TCP with TLS
// (TLS 1.3, AES-128-GCM): allocs/op counts both sides, crypto/tls's
// included.
func BenchmarkRequestsTLS(b *testing.B) {
	for _, cmd := range []Command{CmdRead, CmdWrite} {
		for _, size := range []uint32{4096, 128 << 10} {
			b.Run(fmt.Sprintf("%v/%dKiB/qd32", cmd, size>>10), func(b *testing.B) {
				p := newPKI(b)
				s := startTLSServer(b, p.files, Options{})
				c, err := s.dialTLS(b, p.clientConf())
				if err != nil {
					b.Fatal(err)
				}
				driveRequests(b, c.nc, cmd, size, 32, uint64(s.mem.Size()))
			})
		}
	}
}
