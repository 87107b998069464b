package main

import (
	"io"
	"net"
	"sync"
)

// tcpProxy forwards loopback connections to a target until it is stopped:
// then its port refuses connections and every open one is cut, as when the
// server behind it stops. The fleet family puts one in front of Redis to
// stop "Redis" in the middle of a window without touching the real one.
type tcpProxy struct {
	target, addr string

	mu    sync.Mutex
	ln    net.Listener // nil once stopped
	conns map[net.Conn]struct{}
}

// startProxy listens on 127.0.0.1:0 and forwards to target.
func startProxy(target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{target: target, addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.link(c)
		}
	}()
	return p, nil
}

// track adds c to the open connections, unless the proxy has stopped.
func (p *tcpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *tcpProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *tcpProxy) link(client net.Conn) {
	if !p.track(client) {
		client.Close()
		return
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(client)
		return
	}
	if !p.track(server) {
		server.Close()
		p.untrack(client)
		return
	}
	go func() {
		_, _ = io.Copy(server, client)
		p.untrack(client, server)
	}()
	_, _ = io.Copy(client, server)
	p.untrack(client, server)
}

// stop closes the port and cuts every open connection. It may be called
// more than once.
func (p *tcpProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}
