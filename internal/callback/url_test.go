package callback

import (
	"encoding/base64"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestCheckURL(t *testing.T) {
	allowed := []string{"hooks.example.com", "127.0.0.1:9000", "[::1]:9001", "Mixed.Example.org", "devbox.internal:*", "[::2]:*"}
	tests := []struct {
		url  string
		want string // "" accepted, else a piece of the error
	}{
		{"https://hooks.example.com/shaper", ""},
		{"http://HOOKS.example.com/x?y=1", ""},
		{"https://mixed.example.org/", ""},
		{"http://127.0.0.1:9000/hook", ""},
		{"http://[::1]:9001/hook", ""},
		{"https://hooks.example.com:8443/x", "not in callbacks.allowed_hosts"},
		{"https://user:pw@hooks.example.com/x", "credentials"},
		{"https://user@hooks.example.com/x", "credentials"},
		{"http://hooks.example.com@evil.example/x", "credentials"},
		{"http://evil.example#@hooks.example.com", "fragment"},
		{"https://hooks.example.com/x#frag", "fragment"},
		{"ftp://hooks.example.com/x", "http"},
		{"//hooks.example.com/x", "http"},
		{"/relative", "http"},
		{"hooks.example.com/x", "http"},
		{"https:hooks.example.com", "no host"},
		{"http://127.0.0.1/", "not in callbacks.allowed_hosts"},
		{"http://127.0.0.1:9001/", "not in callbacks.allowed_hosts"},
		{"http://localhost:9000/", "not in callbacks.allowed_hosts"},
		{"http://2130706433:9000/", "not in callbacks.allowed_hosts"},
		{"http://2130706433/", "not in callbacks.allowed_hosts"},
		{"http://0177.0.0.1:9000/", "not in callbacks.allowed_hosts"},
		{"http://0x7f.0.0.1:9000/", "not in callbacks.allowed_hosts"},
		{"http://127.1:9000/", "not in callbacks.allowed_hosts"},
		{"http://[::1]/", "not in callbacks.allowed_hosts"},
		{"http://[::ffff:127.0.0.1]:9000/", "not in callbacks.allowed_hosts"},
		{"http://[0:0:0:0:0:0:0:1]:9001/", "not in callbacks.allowed_hosts"},
		{"http://169.254.169.254/latest/meta-data", "not in callbacks.allowed_hosts"},
		{"http://hooks.example.com./x", "not in callbacks.allowed_hosts"},
		{"http://hooks.example.com:/x", "not in callbacks.allowed_hosts"},
		{"https://" + strings.Repeat("a", 2100), "longer than"},
		{"http://hooks.example.com/\x7f", "not a URL"},
		// host:* names the host on any port, and only with a port.
		{"http://DevBox.internal:41234/hook", ""},
		{"http://[::2]:41234/hook", ""},
		{"http://devbox.internal/hook", "not in callbacks.allowed_hosts"},
		{"http://devbox.internal:/hook", "not in callbacks.allowed_hosts"},
		{"http://devbox.internal.evil.example:80/", "not in callbacks.allowed_hosts"},
		{"http://[::2]/hook", "not in callbacks.allowed_hosts"},
	}
	for _, tt := range tests {
		err := CheckURL(tt.url, allowed)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckURL(%q): got %v, want it accepted", tt.url, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckURL(%q): got %v, want an error with %q", tt.url, err, tt.want)
		}
	}
	if err := CheckURL("https://hooks.example.com/", nil); !errors.Is(err, ErrHostNotAllowed) {
		t.Errorf("no allowed hosts: got %v, want ErrHostNotAllowed", err)
	}
}

func TestInternalAddresses(t *testing.T) {
	tests := []struct {
		ip   string
		want bool
	}{
		{"127.0.0.1", true}, {"127.9.9.9", true}, {"10.1.2.3", true}, {"172.16.0.1", true}, {"172.31.255.255", true},
		{"192.168.1.1", true}, {"169.254.169.254", true}, {"0.0.0.0", true}, {"0.1.2.3", true}, {"100.64.0.1", true},
		{"224.0.0.1", true}, {"255.255.255.255", true},
		{"::1", true}, {"::", true}, {"fe80::1", true}, {"fc00::1", true}, {"fd12:3456::1", true}, {"ff02::1", true},
		{"::ffff:127.0.0.1", true}, {"::ffff:10.0.0.1", true}, {"::ffff:169.254.169.254", true}, {"64:ff9b::7f00:1", true},
		{"8.8.8.8", false}, {"172.32.0.1", false}, {"100.128.0.1", false}, {"93.184.216.34", false},
		{"2606:4700::1111", false}, {"::ffff:8.8.8.8", false},
	}
	for _, tt := range tests {
		if got := internal(netip.MustParseAddr(tt.ip)); got != tt.want {
			t.Errorf("internal(%s): got %v, want %v", tt.ip, got, tt.want)
		}
	}
}

func TestCheckDial(t *testing.T) {
	allowed := []string{"127.0.0.1:9000", "[::1]:9001", "10.0.0.5", "hooks.example.com", "localhost:9002", "127.0.0.2:*", "[::2]:*"}
	tests := []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:9000", true},
		{"127.0.0.1:9001", false},
		{"[::1]:9001", true},
		{"[::1]:9000", false},
		{"[::ffff:127.0.0.1]:9000", true}, // the same address, mapped
		{"10.0.0.5:443", true},
		{"10.0.0.6:443", false},
		// localhost is listed, but what it resolves to is not: refused.
		{"127.0.0.1:9002", false},
		{"169.254.169.254:80", false},
		{"93.184.216.34:443", true},
		{"not-an-address", false},
		// 127.0.0.2:* allows that address on any port, and nothing else.
		{"127.0.0.2:41234", true},
		{"127.0.0.3:41234", false},
		{"[::2]:41234", true},
	}
	for _, tt := range tests {
		err := checkDial(tt.addr, allowed)
		if (err == nil) != tt.ok {
			t.Errorf("checkDial(%s): got %v, want ok %v", tt.addr, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errInternalAddress) {
			t.Errorf("checkDial(%s): got %v, want errInternalAddress", tt.addr, err)
		}
	}
}

// The example of the Standard Webhooks specification's test suite.
func TestSignKnownVector(t *testing.T) {
	secret, err := base64.StdEncoding.DecodeString("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	got := Sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
