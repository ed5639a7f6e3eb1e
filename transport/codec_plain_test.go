//go:build !vtprotobuf

package transport

const vtprotobufTag = false
