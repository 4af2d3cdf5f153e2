package pbwire_test

import (
	"github.com/zentinelproxy/sidecar/internal/pbwire/pbwiretest"
	"github.com/zentinelproxy/sidecar/protocol"
)

// The suite the tests share with internal/grpcwire's (pbwiretest), under
// the names the tests here use.

func b(s string) []byte { return []byte(s) }

// protocolMessages is pbwiretest.Messages.
func protocolMessages() []struct {
	name string
	t    protocol.MsgType
	msg  any
} {
	var out []struct {
		name string
		t    protocol.MsgType
		msg  any
	}
	for _, c := range pbwiretest.Messages() {
		out = append(out, struct {
			name string
			t    protocol.MsgType
			msg  any
		}{c.Name, c.Type, c.Msg})
	}
	return out
}

func asMessage(t protocol.MsgType, msg any) protocol.Message { return pbwiretest.AsMessage(t, msg) }

func canon(v any) string { return pbwiretest.Canon(v) }

func decodeFrame(t protocol.MsgType, wire []byte) (any, error) { return pbwiretest.Decode(t, wire) }
