// Command loadgen drives one HTTP(S) URL, or a list of them in turn, and prints one JSON line of results.
//
// Two modes, both over a fixed number of HTTP/1.1 keep-alive connections:
//
//	-mode closed   every connection sends its next request as soon as the previous answer is read: the
//	               server's throughput (requests/s) when the generator is not the bottleneck.
//	-mode rate     requests are due at a fixed rate (wrk2's model, which Debian's wrk lacks); a request's
//	               latency counts from when it was due, not from when a connection was free to send it, so a
//	               server that falls behind shows its queueing delay in p99 (no coordinated omission).
//
// With -urls the requests cycle through the file's URLs in order (one per line: many distinct HPA queries, as a
// cluster with many HPAs asks); -count ends a closed-mode run after that many requests (each URL of the list asked
// once: -count = the number of URLs); -trace writes one line per request: when it was due (Unix ns), its latency
// (µs) and its status (0: a transport error), for relating slow requests to what the server was doing then.
//
// The generator reports its own CPU time, so a run shows whether it, rather than the server, was the limit.
// A client certificate and extra headers make it speak like the kube-aggregator's front proxy.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type headers []string

func (h *headers) String() string     { return strings.Join(*h, ", ") }
func (h *headers) Set(v string) error { *h = append(*h, v); return nil }

type result struct {
	Mode        string  `json:"mode"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	Non2xx      int     `json:"non_2xx"`
	Unfinished  int     `json:"unfinished"`
	Seconds     float64 `json:"seconds"`
	RPS         float64 `json:"rps"`
	TargetRPS   float64 `json:"target_rps,omitempty"`
	P50ms       float64 `json:"p50_ms"`
	P90ms       float64 `json:"p90_ms"`
	P99ms       float64 `json:"p99_ms"`
	MaxMs       float64 `json:"max_ms"`
	BodyBytes   int64   `json:"body_bytes"`
	CPUSeconds  float64 `json:"loadgen_cpu_seconds"`
	FirstError  string  `json:"first_error,omitempty"`
	FirstStatus int     `json:"first_bad_status,omitempty"`
}

func main() {
	url := flag.String("url", "", "URL to GET")
	urlsFile := flag.String("urls", "", "file of URLs to GET in turn, one per line (instead of -url)")
	count := flag.Int("count", 0, "-mode closed: stop after this many requests (0: run for -duration)")
	traceFile := flag.String("trace", "", "write one line per request here: due (Unix ns), latency (µs), status")
	mode := flag.String("mode", "closed", "closed | rate")
	connections := flag.Int("connections", 16, "keep-alive connections")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	warmup := flag.Duration("warmup", time.Second, "closed-loop warm-up before measuring (not counted)")
	rate := flag.Float64("rate", 100, "requests/s in -mode rate")
	caFile := flag.String("cacert", "", "CA bundle that verifies the server (default: do not verify)")
	certFile := flag.String("cert", "", "client certificate (PEM)")
	keyFile := flag.String("key", "", "client key (PEM)")
	var extra headers
	flag.Var(&extra, "H", "extra request header 'Name: value' (repeatable)")
	flag.Parse()
	if (*url == "") == (*urlsFile == "") || (*mode != "closed" && *mode != "rate") || *connections < 1 || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "loadgen: one of -url or -urls, -mode is closed or rate, -connections ≥ 1, -rate > 0")
		os.Exit(2)
	}
	urls := []string{*url}
	if *urlsFile != "" {
		text, err := os.ReadFile(*urlsFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: -urls:", err)
			os.Exit(2)
		}
		urls = strings.Fields(string(text))
		if len(urls) == 0 {
			fmt.Fprintln(os.Stderr, "loadgen: -urls: no URL in", *urlsFile)
			os.Exit(2)
		}
	}
	client, err := newClient(*connections, *caFile, *certFile, *keyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	reqs := make([]*http.Request, len(urls))
	for i, u := range urls {
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: URL:", err)
			os.Exit(2)
		}
		for _, h := range extra {
			name, value, ok := strings.Cut(h, ":")
			if !ok {
				fmt.Fprintf(os.Stderr, "loadgen: -H %q: want 'Name: value'\n", h)
				os.Exit(2)
			}
			req.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
		reqs[i] = req
	}
	g := &gen{client: client, reqs: reqs}
	if *warmup > 0 {
		g.closed(*connections, *warmup, 0)
		g.reset()
	}
	g.tracing = *traceFile != ""
	cpu0 := cpuSeconds()
	var r result
	if *mode == "closed" {
		r = g.closed(*connections, *duration, *count)
	} else {
		r = g.fixedRate(*connections, *duration, *rate)
	}
	r.CPUSeconds = cpuSeconds() - cpu0
	if g.tracing {
		if err := g.writeTrace(*traceFile); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: -trace:", err)
			os.Exit(2)
		}
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

func newClient(connections int, caFile, certFile, keyFile string) (*http.Client, error) {
	config := &tls.Config{InsecureSkipVerify: caFile == ""} //nolint:gosec // loopback benchmark
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate", caFile)
		}
		config.RootCAs = pool
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		config.Certificates = []tls.Certificate{pair}
	}
	transport := &http.Transport{
		TLSClientConfig:     config,
		MaxConnsPerHost:     connections,
		MaxIdleConnsPerHost: connections,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		// NB: HTTP/1.1 for every server: the Go servers would otherwise negotiate HTTP/2, aiohttp cannot.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	return &http.Client{Transport: transport, Timeout: 30 * time.Second}, nil
}

type traced struct {
	due     time.Time
	latency time.Duration
	status  int
}

type gen struct {
	client  *http.Client
	reqs    []*http.Request
	next    atomic.Int64 // the index of the next request's URL (in turn through reqs)
	tracing bool
	trace   []traced

	mu        sync.Mutex
	latencies []time.Duration
	errors    int
	non2xx    int
	bytes     int64
	firstErr  string
	firstBad  int
}

func (g *gen) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.latencies, g.errors, g.non2xx, g.bytes, g.firstErr, g.firstBad = nil, 0, 0, 0, "", 0
	g.trace = nil
	g.next.Store(0)
}

func (g *gen) writeTrace(path string) error {
	var b strings.Builder
	for _, t := range g.trace {
		fmt.Fprintf(&b, "%d %d %d\n", t.due.UnixNano(), t.latency.Microseconds(), t.status)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// one sends a request and records its latency measured from “due“.
func (g *gen) one(due time.Time) {
	req := g.reqs[int((g.next.Add(1)-1)%int64(len(g.reqs)))]
	resp, err := g.client.Do(req)
	var n int64
	status := 0
	if err == nil {
		n, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
	}
	took := time.Since(due)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tracing {
		g.trace = append(g.trace, traced{due, took, status})
	}
	switch {
	case err != nil:
		g.errors++
		if g.firstErr == "" {
			g.firstErr = err.Error()
		}
	case status < 200 || status > 299:
		g.non2xx++
		if g.firstBad == 0 {
			g.firstBad = status
		}
	default:
		g.latencies = append(g.latencies, took)
		g.bytes += n
	}
}

func (g *gen) closed(connections int, d time.Duration, count int) result {
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	var sent atomic.Int64
	for i := 0; i < connections; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if count > 0 {
					if sent.Add(1) > int64(count) {
						return
					}
				} else if !time.Now().Before(deadline) {
					return
				}
				g.one(time.Now())
			}
		}()
	}
	wg.Wait()
	return g.summary("closed", time.Since(start), 0, 0)
}

func (g *gen) fixedRate(connections int, d time.Duration, rate float64) result {
	total := int(rate * d.Seconds())
	due := make(chan time.Time, total)
	var wg sync.WaitGroup
	for i := 0; i < connections; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range due {
				g.one(t)
			}
		}()
	}
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	for i := 0; i < total; i++ {
		t := start.Add(time.Duration(i) * interval)
		if wait := time.Until(t); wait > 0 {
			time.Sleep(wait)
		}
		due <- t
	}
	close(due)
	// NB: requests still queued when the schedule ends are waited for (bounded by the client timeout): a
	// server that fell behind pays for its backlog in the percentiles rather than having it dropped.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	g.mu.Lock()
	unfinished := total - len(g.latencies) - g.errors - g.non2xx
	g.mu.Unlock()
	return g.summary("rate", time.Since(start), rate, unfinished)
}

func (g *gen) summary(mode string, took time.Duration, rate float64, unfinished int) result {
	g.mu.Lock()
	defer g.mu.Unlock()
	sort.Slice(g.latencies, func(i, j int) bool { return g.latencies[i] < g.latencies[j] })
	pct := func(p float64) float64 {
		if len(g.latencies) == 0 {
			return 0
		}
		i := int(p / 100 * float64(len(g.latencies)))
		if i >= len(g.latencies) {
			i = len(g.latencies) - 1
		}
		return float64(g.latencies[i].Microseconds()) / 1000
	}
	return result{
		Mode: mode, Requests: len(g.latencies), Errors: g.errors, Non2xx: g.non2xx, Unfinished: unfinished,
		Seconds: took.Seconds(), RPS: float64(len(g.latencies)) / took.Seconds(), TargetRPS: rate,
		P50ms: pct(50), P90ms: pct(90), P99ms: pct(99), MaxMs: pct(100), BodyBytes: g.bytes,
		FirstError: g.firstErr, FirstStatus: g.firstBad,
	}
}

func cpuSeconds() float64 {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}
