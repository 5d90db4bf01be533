// The lab's Go client stack: the libraries OpenIM itself uses, grpc-go for push's calls to the
// gateways and gorilla/websocket for the users' connections. The lab drives it over JSON lines
// (commands on stdin, events on stdout) and does all the OpenIM-specific work itself: it encodes
// the push request and decodes the answer, so this program needs no generated code and no protoc.
//
//	openim-lab-go push  --family ipv4|dual-stack [--reuse]   one gRPC call per command, each on a new
//	                                                          connection (with --reuse: one per gateway)
//	openim-lab-go users --family ipv4|dual-stack   one WebSocket per command, reports each text message
//
// Built in GOPATH mode against Debian's packages (golang-google-grpc-dev,
// golang-github-gorilla-websocket-dev); see tests/src/lab/stack.rs.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

const callTimeout = 5 * time.Second

// rawCodec passes the lab's already encoded protobuf bytes through. Registered under "proto",
// it replaces grpc-go's protobuf codec, so calls still say `content-type: application/grpc`.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	if bytes, ok := v.(*[]byte); ok {
		return *bytes, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	if bytes, ok := v.(*[]byte); ok {
		*bytes = append([]byte(nil), data...)
		return nil
	}
	return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
}

func (rawCodec) Name() string { return "proto" }

// output serialises the event lines of concurrent goroutines.
type output struct {
	mu      sync.Mutex
	encoder *json.Encoder
}

func (o *output) emit(event interface{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.encoder.Encode(event)
}

// dialer connects over an IPv4 socket, or over an IPv6 one to the IPv4-mapped address
// (`::ffff:a.b.c.d`, a dual-stack socket). Go picks an IPv4 socket for an IPv4 destination
// unless the local address is IPv6: bound to `[::]:0`, the socket is AF_INET6 and the
// destination becomes IPv4-mapped.
func dialer(family string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, address string) (net.Conn, error) {
		if family == "ipv4" {
			var d net.Dialer
			return d.DialContext(ctx, "tcp4", address)
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv6unspecified}}
		return d.DialContext(ctx, "tcp", address)
	}
}

type pushCall struct {
	ID        uint64 `json:"id"`
	Target    string `json:"target"`
	Authority string `json:"authority"`
	Method    string `json:"method"`
	Request   []byte `json:"request"`
}

type pushAnswer struct {
	ID       uint64 `json:"id"`
	Response []byte `json:"response,omitempty"`
	Error    string `json:"error,omitempty"`
}

// push makes each call on a new connection and never closes it, as OpenIM 3.5.1 push does; with
// reuse, it keeps one connection per gateway and authority for every call, as 3.6 and later do.
func push(family string, reuse bool, out *output) error {
	encoding.RegisterCodec(rawCodec{})
	var leaked []*grpc.ClientConn
	kept := map[string]*grpc.ClientConn{}
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 16<<20)
	for lines.Scan() {
		var call pushCall
		if err := json.Unmarshal(lines.Bytes(), &call); err != nil {
			out.emit(pushAnswer{Error: "bad command: " + err.Error()})
			continue
		}
		answer := pushAnswer{ID: call.ID}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		key := call.Target + " " + call.Authority
		conn, err := kept[key], error(nil)
		if conn == nil {
			conn, err = grpc.DialContext(ctx, call.Target,
				grpc.WithInsecure(),
				grpc.WithBlock(),
				grpc.WithAuthority(call.Authority),
				grpc.WithContextDialer(dialer(family)))
			if err == nil {
				leaked = append(leaked, conn)
				if reuse {
					kept[key] = conn
				}
			}
		}
		if err == nil {
			var response []byte
			err = conn.Invoke(ctx, call.Method, &call.Request, &response)
			answer.Response = response
		}
		cancel()
		if err != nil {
			answer.Error = err.Error()
		}
		out.emit(answer)
	}
	return lines.Err()
}

type userConnect struct {
	User string `json:"user"`
	URL  string `json:"url"`
	// The proxy's address, `ip:port`.
	Address string `json:"address"`
}

type userEvent struct {
	Event       string `json:"event"`
	User        string `json:"user"`
	ClientMsgID string `json:"client_msg_id,omitempty"`
	Error       string `json:"error,omitempty"`
}

// users opens each user's WebSocket and reports every message that arrives on it. The
// connections stay open until stdin closes.
func users(family string, out *output) error {
	dial := dialer(family)
	websocketDialer := websocket.Dialer{
		HandshakeTimeout: callTimeout,
		NetDialContext: func(ctx context.Context, _ string, address string) (net.Conn, error) {
			return dial(ctx, address)
		},
	}
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		var user userConnect
		if err := json.Unmarshal(lines.Bytes(), &user); err != nil {
			out.emit(userEvent{Event: "failed", Error: "bad command: " + err.Error()})
			continue
		}
		go func(user userConnect) {
			conn, _, err := websocketDialer.Dial(user.URL, nil)
			if err != nil {
				out.emit(userEvent{Event: "failed", User: user.User, Error: err.Error()})
				return
			}
			out.emit(userEvent{Event: "connected", User: user.User})
			for {
				kind, data, err := conn.ReadMessage()
				if err != nil {
					return
				}
				if kind != websocket.TextMessage {
					continue
				}
				var message struct {
					ClientMsgID string `json:"clientMsgID"`
				}
				if json.Unmarshal(data, &message) == nil && message.ClientMsgID != "" {
					out.emit(userEvent{Event: "arrived", User: user.User, ClientMsgID: message.ClientMsgID})
				}
			}
		}(user)
	}
	return lines.Err()
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: openim-lab-go push|users --family ipv4|dual-stack [--reuse]")
		os.Exit(2)
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	family := flags.String("family", "ipv4", "ipv4 or dual-stack")
	reuse := flags.Bool("reuse", false, "push: one long-lived connection per gateway")
	_ = flags.Parse(os.Args[2:])
	if *family != "ipv4" && *family != "dual-stack" {
		fmt.Fprintf(os.Stderr, "openim-lab-go: unknown family %q\n", *family)
		os.Exit(2)
	}
	out := &output{encoder: json.NewEncoder(os.Stdout)}
	var err error
	switch os.Args[1] {
	case "push":
		err = push(*family, *reuse, out)
	case "users":
		err = users(*family, out)
	default:
		err = errors.New("unknown mode " + os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "openim-lab-go: %v\n", err)
		os.Exit(1)
	}
}
