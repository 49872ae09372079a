package main

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// hdrClientSecret is the header that carries -client-secret. It is removed
// before a request is forwarded.
const hdrClientSecret = "X-Ratecord-Client-Secret"

// minClientSecret is the shortest -client-secret accepted.
const minClientSecret = 16

// clientAuth decides whether a request may use the proxy: by the shared
// client secret, or by an Authorization header on the list of allowed bot
// credentials. It keeps neither the secret nor a token: the secret as its
// SHA-256 digest, the credentials as HMACs under a key drawn at start and
// never written anywhere. The zero value lets every request through. It
// is safe for concurrent use.
type clientAuth struct {
	secret  []byte            // SHA-256 of the client secret, or nil
	key     []byte            // HMAC key of allowed
	allowed map[[32]byte]bool // HMAC-SHA256 of each allowed Authorization value
}

// newClientAuth returns the authentication of secret (none if "") and
// tokens (Authorization values, none if empty).
func newClientAuth(secret string, tokens []string) *clientAuth {
	a := &clientAuth{}
	if secret != "" {
		sum := sha256.Sum256([]byte(secret))
		a.secret = sum[:]
	}
	if len(tokens) > 0 {
		a.key = make([]byte, 32)
		rand.Read(a.key) // never fails (crypto/rand)
		a.allowed = make(map[[32]byte]bool, len(tokens))
		for _, tok := range tokens {
			a.allowed[a.digest(tok)] = true
		}
	}
	return a
}

// enabled reports whether requests must authenticate.
func (a *clientAuth) enabled() bool { return a.secret != nil || a.allowed != nil }

// bySecret reports whether h carries exactly one client secret header
// with the right secret. The comparison takes the same time whatever the
// secret sent.
func (a *clientAuth) bySecret(h http.Header) bool {
	if a.secret == nil {
		return false
	}
	vals := h.Values(hdrClientSecret)
	if len(vals) != 1 {
		return false
	}
	sum := sha256.Sum256([]byte(vals[0]))
	return subtle.ConstantTimeCompare(sum[:], a.secret) == 1
}

// byCredential reports whether auth, a request's Authorization value, is
// one of the allowed credentials.
func (a *clientAuth) byCredential(auth string) bool {
	return a.allowed != nil && auth != "" && a.allowed[a.digest(auth)]
}

func (a *clientAuth) digest(auth string) [32]byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(auth))
	var sum [32]byte
	m.Sum(sum[:0])
	return sum
}

// authorization returns the Authorization value of a token given on the
// command line: "Bot " and a bare token, or a value with a scheme as it is.
func authorization(token string) string {
	token = strings.TrimSpace(token)
	if token != "" && !strings.Contains(token, " ") {
		token = "Bot " + token
	}
	return token
}
