// TLS credentials from PEM files, re-read when they change on disk.

package nbd

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// TLSFiles names the PEM files of a server's TLS credentials.
type TLSFiles struct {
	// Cert is the server's certificate, followed by any intermediate
	// certificates clients need to reach their CA.
	Cert string
	// Key is the certificate's private key (unencrypted).
	Key string
	// CA, if set, holds the certificates of the authorities whose client
	// certificates are accepted: clients must then present one (mutual
	// TLS). Empty: clients are not asked for a certificate.
	CA string
}

// Config loads the files and returns a server configuration for ServeTLS,
// or an error that names the file at fault and why.
//
// The configuration checks the files' size, modification time and inode
// at every new connection (a stat each, no read) and loads them again when
// any changed: certificates rotated on disk serve the next connections
// without a signal or a restart. Connections already open keep the
// session they began with. Files that changed but do not load (a
// certificate written before its key, a typo) leave the credentials loaded
// before in use; log, if not nil, gets a line for each such change and for
// each load.
func (f TLSFiles) Config(log *slog.Logger) (*tls.Config, error) {
	st := f.stamps()
	conf, err := f.load()
	if err != nil {
		return nil, err
	}
	r := &tlsReloader{files: f, log: log, stamp: st, conf: conf}
	r.loaded("nbd: TLS credentials loaded")
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: r.configForClient,
	}, nil
}

// load reads and checks the files.
func (f TLSFiles) load() (*tls.Config, error) {
	certPEM, err := os.ReadFile(f.Cert)
	if err != nil {
		return nil, fmt.Errorf("reading the TLS certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(f.Key)
	if err != nil {
		return nil, fmt.Errorf("reading the TLS key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// crypto/tls's errors say what is wrong, not with which file.
		return nil, fmt.Errorf("the TLS certificate %s with the key %s: %w", f.Cert, f.Key, err)
	}
	now := time.Now()
	switch leaf := cert.Leaf; {
	case now.After(leaf.NotAfter):
		return nil, fmt.Errorf("the TLS certificate %s expired on %s", f.Cert, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("the TLS certificate %s is not valid before %s", f.Cert, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	conf := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// NBD connections live long, so resuming a session saves little;
		// without tickets every connection is checked against the
		// credentials on disk at its start, whatever it had before.
		SessionTicketsDisabled: true,
		// Replies are gathered into records of the most TLS allows
		// (tlsRecordSize); crypto/tls would cut a connection's first
		// 128 KiB into records of a TCP segment, each a system call,
		// which helps a browser show a page early and no NBD client.
		DynamicRecordSizingDisabled: true,
	}
	if f.CA != "" {
		pool, err := loadCAs(f.CA)
		if err != nil {
			return nil, err
		}
		conf.ClientAuth = tls.RequireAndVerifyClientCert
		conf.ClientCAs = pool
	}
	return conf, nil
}

// loadCAs reads a bundle of PEM certificates, every one of which must
// parse: a CA file that silently drops a certificate would refuse its
// clients with no word of why.
func loadCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the TLS CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		n++
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the TLS CA bundle %s: certificate %d: %w", path, n, err)
		}
		pool.AddCert(c)
	}
	if n == 0 {
		return nil, fmt.Errorf("the TLS CA bundle %s holds no PEM certificate", path)
	}
	return pool, nil
}

// fileStamp tells a file's versions apart without reading it: a rename
// over it (as certbot and Kubernetes do) changes the inode, a rewrite in
// place the size or the modification time.
type fileStamp struct {
	ino   uint64
	size  int64
	mtime int64
	err   string // the stat's failure; the others are zero then
}

// stamps stats the files: certificate, key and CA.
func (f TLSFiles) stamps() [3]fileStamp {
	var st [3]fileStamp
	for i, path := range [3]string{f.Cert, f.Key, f.CA} {
		if path == "" {
			continue
		}
		fi, err := os.Stat(path)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			st[i].err = err.Error()
			continue
		}
		st[i].size, st[i].mtime = fi.Size(), fi.ModTime().UnixNano()
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st[i].ino = sys.Ino
		}
	}
	return st
}

// tlsReloader hands each new connection the credentials the files hold.
type tlsReloader struct {
	files TLSFiles
	log   *slog.Logger

	mu sync.Mutex
	// stamp is the files' as conf was loaded from them; failed the
	// files' as they last failed to load, not tried again until they
	// change.
	stamp, failed [3]fileStamp
	conf          *tls.Config
}

func (r *tlsReloader) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	st := r.files.stamps()
	r.mu.Lock()
	defer r.mu.Unlock()
	if st == r.stamp || st == r.failed {
		return r.conf, nil
	}
	conf, err := r.files.load()
	if err != nil {
		r.failed = st
		if r.log != nil {
			r.log.Error("nbd: the TLS credentials changed on disk but do not load; new connections get the ones loaded before",
				"err", err)
		}
		return r.conf, nil
	}
	r.stamp, r.failed, r.conf = st, [3]fileStamp{}, conf
	r.loaded("nbd: TLS credentials reloaded: new connections get them")
	return conf, nil
}

// loaded logs what r.conf holds.
func (r *tlsReloader) loaded(msg string) {
	if r.log == nil {
		return
	}
	leaf := r.conf.Certificates[0].Leaf
	r.log.Info(msg, "cert", r.files.Cert, "subject", leaf.Subject.String(),
		"not_after", leaf.NotAfter.UTC().Format(time.RFC3339), "client_cert_required", r.conf.ClientAuth == tls.RequireAndVerifyClientCert)
}
