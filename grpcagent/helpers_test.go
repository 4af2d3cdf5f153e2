package grpcagent_test

import "google.golang.org/grpc"

type grpcServerOption = grpc.ServerOption
