package regional

import "bytes"

// keySlot is the Redis Cluster slot of a key: CRC16 (XMODEM) of its hash
// tag, or of the whole key if it has none, modulo 16384.
func keySlot(key []byte) uint16 {
	if i := bytes.IndexByte(key, '{'); i >= 0 {
		if j := bytes.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for _, b := range key {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
