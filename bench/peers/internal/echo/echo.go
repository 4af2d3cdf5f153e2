// Package echo is the gRPC service of the peer benchmark's gRPC rows: a
// unary Echo of a google.protobuf.BytesValue, without generated code, on
// two services: peers.Echo (allowed) and admin (its path /admin/Echo is
// one the job denies, so a proxy that does the job never lets it through).
package echo

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The methods' full names.
const (
	Method      = "/peers.Echo/Echo"
	AdminMethod = "/admin/Echo"
)

// Handler is what the server does with one call: the message in and the
// call's context (its metadata); it answers the message back.
type Handler func(ctx context.Context, in *wrapperspb.BytesValue, admin bool)

// Register registers both services on s, calling h for each call.
func Register(s *grpc.Server, h Handler) {
	for _, svc := range []struct {
		name  string
		admin bool
	}{{"peers.Echo", false}, {"admin", true}} {
		admin := svc.admin
		s.RegisterService(&grpc.ServiceDesc{
			ServiceName: svc.name,
			HandlerType: (*any)(nil),
			Methods: []grpc.MethodDesc{{
				MethodName: "Echo",
				Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
					in := new(wrapperspb.BytesValue)
					if err := dec(in); err != nil {
						return nil, err
					}
					h(ctx, in, admin)
					return in, nil
				},
			}},
			Metadata: "peers.proto",
		}, struct{}{})
	}
}
