"""Generated gRPC/protobuf code of the index service; regenerate with scripts/gen_proto.sh."""
