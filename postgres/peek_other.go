//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package postgres

import "net"

// peek cannot inspect a socket here: pgx's own checks decide.
func peek(net.Conn) peerState { return peerUnknown }
