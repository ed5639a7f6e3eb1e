//go:build vtprotobuf

package transport

const vtprotobufTag = true
