package grpcagent

// Regenerate pb/ from agent.proto; needs protoc, protoc-gen-go and
// protoc-gen-go-grpc on PATH (see README.md).
//go:generate protoc --proto_path=. --go_out=pb --go_opt=paths=source_relative --go-grpc_out=pb --go-grpc_opt=paths=source_relative agent.proto
