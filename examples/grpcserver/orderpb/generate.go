// Package orderpb is the example order API's gRPC code, generated from
// orders.proto by protoc (Debian's protobuf-compiler) with protoc-gen-go and
// protoc-gen-go-grpc from the Go module proxy:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//	go generate ./examples/grpcserver/orderpb
package orderpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative orders.proto
