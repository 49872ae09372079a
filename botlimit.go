package ratecord

import (
	"encoding/base64"
	"strings"
)

// botID returns the user id a bot token's first segment encodes, from an
// Authorization header ("Bot <token>"), or "" when it holds none.
func botID(auth string) string {
	tok, ok := strings.CutPrefix(auth, "Bot ")
	if !ok {
		return ""
	}
	seg, _, _ := strings.Cut(tok, ".")
	seg = strings.TrimRight(seg, "=")
	if len(seg) == 0 || len(seg) > 32 {
		return ""
	}
	var buf [24]byte
	n, err := base64.RawStdEncoding.Decode(buf[:], []byte(seg))
	if err != nil {
		n, err = base64.RawURLEncoding.Decode(buf[:], []byte(seg))
	}
	if err != nil || n == 0 || !allDigits(buf[:n]) {
		return ""
	}
	return string(buf[:n])
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
