package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// An upstream that answers after the request's headers and resets the
// connection (closes it with the body unread) while the body is being
// sent: the client of NewTransport gets the answer each time, never the
// failed write of the body. Whichever net/http's transport met first
// decided before (answerfirst.go): 3 of 5 runs met the write first
// within 20 exchanges.
func TestAnswerBeforeTheBodyWinsOverTheFailedWrite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go answerAndReset(c)
		}
	}()
	client := &http.Client{Transport: NewTransport()}
	body := strings.Repeat("x", 4<<20)
	for i := range 100 {
		res, err := client.Post("http://"+ln.Addr().String()+"/upload", "text/plain", io.NopCloser(strings.NewReader(body)))
		if err != nil {
			t.Fatalf("exchange %d: the answer was lost: %v", i, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too big\n" {
			t.Fatalf("exchange %d: got %d %q, want the upstream's 413", i, res.StatusCode, b)
		}
	}
}

// answerAndReset reads a request's headers, answers 413 and resets the
// connection, the body unread.
func answerAndReset(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		l, err := br.ReadString('\n')
		if err != nil || l == "\r\n" {
			break
		}
	}
	io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n")
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
}
