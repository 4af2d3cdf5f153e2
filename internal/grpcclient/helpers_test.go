package grpcclient_test

import "google.golang.org/grpc"

type grpcServerOption = grpc.ServerOption
