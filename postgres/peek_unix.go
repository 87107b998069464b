//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package postgres

import (
	"errors"
	"net"
	"syscall"
)

// peek looks at c's socket without reading from it and without blocking.
func peek(c net.Conn) peerState {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peerUnknown
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peerUnknown
	}
	// Control, not Read: pgx may have a background read of its own
	// blocked on the socket (it starts one while a write could block, and
	// it ends only when data comes), and Read would wait for it. A peek
	// takes nothing that read would miss.
	state := peerUnknown
	err = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n > 0:
			state = peerSent
		case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK):
			state = peerQuiet
		case errors.Is(err, syscall.EINTR):
			state = peerUnknown
		default: // n == 0 without an error is EOF: the peer closed
			state = peerGone
		}
	})
	if err != nil {
		return peerGone // the connection is closed on this side
	}
	return state
}
