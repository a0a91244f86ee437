// Package testpki makes X.509 certificates for tests: a certificate
// authority, and the server and client certificates it signs (ECDSA
// P-256), as the PEM files TLS servers and clients read.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the certificate, PEM-encoded: a CA bundle of one.
	PEM []byte
}

// NewCA makes a self-signed authority named name, valid from an hour ago
// for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pemBlock("CERTIFICATE", der)}, nil
}

// Leaf is a certificate the CA signed, with its key, PEM-encoded.
type Leaf struct {
	CertPEM, KeyPEM []byte
}

// Server signs a server certificate named name for hosts (DNS names or IP
// addresses), valid from an hour ago for a day.
func (ca *CA) Server(name string, hosts ...string) (Leaf, error) {
	return ca.Issue(name, hosts, x509.ExtKeyUsageServerAuth, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
}

// Client signs a client certificate named name, valid from an hour ago
// for a day.
func (ca *CA) Client(name string) (Leaf, error) {
	return ca.Issue(name, nil, x509.ExtKeyUsageClientAuth, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
}

// Issue signs a certificate named name for hosts, for usage, valid from
// notBefore to notAfter.
func (ca *CA) Issue(name string, hosts []string, usage x509.ExtKeyUsage, notBefore, notAfter time.Time) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"gzramd test"}},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Leaf{}, err
	}
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", k)}, nil
}

// Write writes the certificate and the key to dir/cert and dir/key (mode
// 0600), and returns their paths. It writes each through a file of its
// own renamed over the old, as tools that rotate certificates do.
func (l Leaf) Write(dir, cert, key string) (certPath, keyPath string, err error) {
	certPath, keyPath = filepath.Join(dir, cert), filepath.Join(dir, key)
	if err := WriteFile(certPath, l.CertPEM); err != nil {
		return "", "", err
	}
	if err := WriteFile(keyPath, l.KeyPEM); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// WriteFile replaces path with b (mode 0600) by a rename.
func WriteFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return nil
}

// ClientDir writes the files a GnuTLS client (libnbd's tls-certificates=,
// qemu's tls-creds-x509 dir=) reads from a directory: ca-cert.pem, the
// authority that signed the server's certificate, and with a client
// certificate (client non-nil) client-cert.pem and client-key.pem.
func ClientDir(dir string, serverCA *CA, client *Leaf) error {
	if err := WriteFile(filepath.Join(dir, "ca-cert.pem"), serverCA.PEM); err != nil {
		return err
	}
	if client == nil {
		return nil
	}
	_, _, err := client.Write(dir, "client-cert.pem", "client-key.pem")
	return err
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
