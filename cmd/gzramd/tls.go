// The TLS flags of `gzramd serve`, and the rule that keeps --tcp beyond
// loopback encrypted unless the operator says otherwise.

package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/gzramd/gzramd/pkg/serving"
	"github.com/gzramd/gzramd/pkg/supervise"
)

// tlsFlags binds --tls-cert, --tls-key, --tls-ca and --tcp-insecure to cfg.
func tlsFlags(f *pflag.FlagSet, cfg *serving.Config) {
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "serve --tcp over TLS with the certificate in `FILE` (PEM; intermediate certificates after it), with --tls-key. "+
		"The TCP listener then serves only clients that start TLS first (NBD_OPT_STARTTLS: libnbd's nbds:// URIs, qemu's tls-creds, nbd-client -certfile); "+
		"the Unix socket stays plain. The files are checked at every new connection and read again when they change: "+
		"a rotated certificate serves the next connections, without a restart or a signal. "+
		"To try it, make a self-signed certificate for the name or address the clients dial: "+
		"openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 -subj /CN=HOST -addext subjectAltName=DNS:HOST,IP:ADDR -keyout key.pem -out cert.pem "+
		"(or certtool from gnutls-bin), then on a client copy cert.pem to DIR/ca-cert.pem and run nbdinfo 'nbds://HOST:PORT/gzram0?tls-certificates=DIR'")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "the private key of --tls-cert, in `FILE` (PEM, unencrypted): keep it readable by gzramd's user alone (mode 0600)")
	f.StringVar(&cfg.TLSCA, "tls-ca", "", "with --tls-cert: require a client certificate signed by one of the CAs in `FILE`, a PEM bundle (mutual TLS), "+
		"and name each client in the log by its certificate's subject. A libnbd client finds its certificate and key in DIR/client-cert.pem and DIR/client-key.pem "+
		"(tls-certificates=DIR); make them with openssl req -newkey, signed by the CA with openssl x509 -req")
	f.BoolVar(&cfg.TCPInsecure, "tcp-insecure", false, "serve --tcp beyond loopback (0.0.0.0, ::, a network address or name) without TLS: "+
		"anyone who can reach it can read and write the device, and swap holds processes' memory (keys, passwords). "+
		"Without this flag such an address needs --tls-cert and --tls-key; loopback may stay plain")
}

// validateTLS checks the TLS flags and the --tcp address they secure:
// beyond loopback, TLS or --tcp-insecure; and the credentials load.
func validateTLS(c *serving.Config) error {
	files, on := c.TLSFiles()
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("--tls-cert and --tls-key go together: give both, the certificate and its private key")
	case c.TLSCA != "" && !on:
		return errors.New("--tls-ca needs --tls-cert and --tls-key: client certificates are asked for in a TLS session, which those set up")
	case on && c.TCP == "":
		return errors.New("--tls-cert and --tls-key secure --tcp, which is not given: the Unix socket is never TLS (its mode, 0600, says who may connect)")
	case on && c.TCPInsecure:
		return errors.New("--tcp-insecure contradicts --tls-cert: drop --tcp-insecure to serve --tcp over TLS")
	case c.TCP != "" && !on && !c.TCPInsecure && !serving.LoopbackTCP(c.TCP):
		return fmt.Errorf("refusing --tcp %s without TLS: beyond loopback anyone who can reach it could read and write the device, and swap holds processes' memory. "+
			"Serve it over TLS with --tls-cert FILE --tls-key FILE (and --tls-ca FILE to require client certificates; gzramd serve --help tells how to make them), "+
			"or pass --tcp-insecure to serve it in the clear anyway", c.TCP)
	case on && c.Socket == "" && (c.Device != "" || c.Swap):
		return errors.New("--device and --swap attach the kernel through --socket when --tcp has TLS, which the kernel does not speak: give --socket PATH")
	}
	// A serving process under the supervisor loads them itself: one that
	// takes the device over must serve it whatever the files hold now,
	// and leaves the TCP listener off if they do not load (the
	// supervisor checked them at its own start).
	if on && !supervise.FromEnv().Serving {
		if _, err := files.Config(nil); err != nil {
			return fmt.Errorf("invalid --tls-cert, --tls-key or --tls-ca: %w", err)
		}
	}
	return nil
}
