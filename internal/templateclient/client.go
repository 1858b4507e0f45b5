// Package templateclient builds a template from a Dockerfile and a context
// directory through the platform's REST API. It is what `warren template
// build` uses, and it speaks the same API, in the same order, as the E2B
// SDK's Template.build: create the build (POST /v3/templates), upload the
// files of each COPY step unless the server has them (GET
// /templates/{id}/files/{hash}, PUT to the returned URL), start it (POST
// /v2/templates/{id}/builds/{buildID}) and poll its status and logs (GET
// /templates/{id}/builds/{buildID}/status?logsOffset=N). So it works
// against any E2B-compatible server, not only Warren.
package templateclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/dockerfile"
)

// Client talks to one platform API.
type Client struct {
	apiURL string
	apiKey string
	// HTTP is the client requests go through.
	HTTP *http.Client
	// PollInterval is the time between two status polls (200 ms, as the
	// SDK's).
	PollInterval time.Duration
}

// New returns a client of the API at apiURL (e.g. http://127.0.0.1:3000)
// that authenticates with apiKey (the X-API-Key header).
func New(apiURL, apiKey string) *Client {
	return &Client{
		apiURL:       strings.TrimRight(apiURL, "/"),
		apiKey:       apiKey,
		HTTP:         &http.Client{},
		PollInterval: 200 * time.Millisecond,
	}
}

// BuildOptions are what to build.
type BuildOptions struct {
	// Name is the template's name, optionally with a tag: name[:tag].
	Name string
	// Dockerfile is the Dockerfile's text (see dockerfile.Parse).
	Dockerfile string
	// ContextDir is the directory COPY sources are relative to.
	ContextDir string
	// CPUCount and MemoryMB size the template's sandboxes; 0 leaves them
	// to the server.
	CPUCount, MemoryMB int
	// Force skips the build cache.
	Force bool
	// Progress, if not nil, is called (from Build's goroutine) for each
	// build log entry and each change of the build's status.
	Progress func(Event)
}

// Result identifies the build.
type Result struct {
	TemplateID string
	BuildID    string
	// Status is the build's last status: ready, or error.
	Status string
}

// Event is a build log entry (Message set) or a change of the build's
// status (Message empty, or the reason of an error).
type Event struct {
	Time time.Time
	// Status is the build's status when the event was received.
	Status string
	// Step is the step the entry is about: "base", "1".."N" (1-based
	// index into the steps), "finalize", or "".
	Step string
	// Level is debug, info, warn or error.
	Level   string
	Message string
}

// APIError is a non-2xx response of the API.
type APIError struct {
	Method, Path string
	StatusCode   int
	// Code and Message are the error body's.
	Code    int
	Message string
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	return fmt.Sprintf("%s %s: %d: %s", e.Method, e.Path, e.StatusCode, msg)
}

// BuildError is a build that ended in the error status.
type BuildError struct {
	Result
	// Step is where it failed ("base", "1".."N", "finalize"), if known.
	Step    string
	Message string
}

func (e *BuildError) Error() string {
	if e.Step != "" {
		return fmt.Sprintf("build %s failed at step %s: %s", e.BuildID, e.Step, e.Message)
	}
	return fmt.Sprintf("build %s failed: %s", e.BuildID, e.Message)
}

// Wire types (contract §3.7).
type (
	templateRequest struct {
		Name     string `json:"name"`
		CPUCount int    `json:"cpuCount,omitempty"`
		MemoryMB int    `json:"memoryMB,omitempty"`
	}
	templateResponse struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	fileUpload struct {
		Present bool              `json:"present"`
		URL     string            `json:"url"`
		Headers map[string]string `json:"headers"`
	}
	logEntry struct {
		Timestamp time.Time `json:"timestamp"`
		Level     string    `json:"level"`
		Message   string    `json:"message"`
		Step      string    `json:"step"`
	}
	buildInfo struct {
		Status     string     `json:"status"`
		LogEntries []logEntry `json:"logEntries"`
		Reason     *struct {
			Message string `json:"message"`
			Step    string `json:"step"`
		} `json:"reason"`
	}
)

// Build builds opts.Dockerfile as template opts.Name and waits for the
// build to end. A build that ends in error returns a *BuildError (with
// the Result); the API's error responses are *APIError.
func (c *Client) Build(ctx context.Context, opts BuildOptions) (Result, error) {
	if opts.Name == "" {
		return Result{}, errors.New("a template name is required")
	}
	spec, err := dockerfile.Parse(opts.Dockerfile)
	if err != nil {
		return Result{}, err
	}
	spec.Force = opts.Force

	// Hash the COPY sources first: a missing file should fail before the
	// server is asked for anything.
	type upload struct {
		hash  string
		files []contextFile
	}
	var uploads []upload
	var bc *buildContext
	seen := map[string]bool{}
	for i := range spec.Steps {
		s := &spec.Steps[i]
		if s.Type != "COPY" {
			continue
		}
		if bc == nil {
			dir := opts.ContextDir
			if dir == "" {
				dir = "."
			}
			if bc, err = loadContext(dir); err != nil {
				return Result{}, err
			}
		}
		files, err := bc.match(s.Args[0])
		if err != nil {
			return Result{}, err
		}
		if s.FilesHash, err = filesHash(s.Args[0], s.Args[1], files, bc.dir); err != nil {
			return Result{}, err
		}
		if !seen[s.FilesHash] {
			seen[s.FilesHash] = true
			uploads = append(uploads, upload{s.FilesHash, files})
		}
	}

	var tr templateResponse
	if err := c.call(ctx, "POST", "/v3/templates", templateRequest{Name: opts.Name, CPUCount: opts.CPUCount, MemoryMB: opts.MemoryMB}, &tr); err != nil {
		return Result{}, err
	}
	res := Result{TemplateID: tr.TemplateID, BuildID: tr.BuildID}
	if res.TemplateID == "" || res.BuildID == "" {
		return res, errors.New("POST /v3/templates: the response has no templateID or buildID")
	}
	tid, bid := url.PathEscape(res.TemplateID), url.PathEscape(res.BuildID)

	for _, u := range uploads {
		var fu fileUpload
		if err := c.call(ctx, "GET", "/templates/"+tid+"/files/"+url.PathEscape(u.hash), nil, &fu); err != nil {
			return res, err
		}
		if fu.Present {
			continue
		}
		if fu.URL == "" {
			return res, fmt.Errorf("the server has no files %s but gave no upload URL", u.hash)
		}
		if err := c.upload(ctx, fu, u.files, bc.dir); err != nil {
			return res, err
		}
	}

	if err := c.call(ctx, "POST", "/v2/templates/"+tid+"/builds/"+bid, spec, nil); err != nil {
		return res, err
	}
	return c.wait(ctx, res, opts.Progress)
}

// wait polls the build's status until it ends and its logs are drained.
func (c *Client) wait(ctx context.Context, res Result, progress func(Event)) (Result, error) {
	if progress == nil {
		progress = func(Event) {}
	}
	statusPath := "/templates/" + url.PathEscape(res.TemplateID) + "/builds/" + url.PathEscape(res.BuildID) + "/status"
	offset := 0
	last := ""
	for {
		var info buildInfo
		if err := c.call(ctx, "GET", statusPath+"?logsOffset="+strconv.Itoa(offset), nil, &info); err != nil {
			return res, err
		}
		res.Status = info.Status
		terminal := info.Status == "ready" || info.Status == "error"
		if !terminal && info.Status != last {
			last = info.Status
			progress(Event{Time: time.Now(), Status: info.Status})
		}
		for _, e := range info.LogEntries {
			progress(Event{Time: e.Timestamp, Status: info.Status, Step: e.Step, Level: e.Level, Message: e.Message})
		}
		offset += len(info.LogEntries)
		if terminal && len(info.LogEntries) == 0 {
			ev := Event{Time: time.Now(), Status: info.Status}
			if info.Status == "ready" {
				progress(ev)
				return res, nil
			}
			be := &BuildError{Result: res, Message: "Unknown error"}
			if info.Reason != nil {
				if info.Reason.Message != "" {
					be.Message = info.Reason.Message
				}
				be.Step = info.Reason.Step
			}
			ev.Level, ev.Step, ev.Message = "error", be.Step, be.Message
			progress(ev)
			return res, be
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(c.PollInterval):
		}
	}
}

// call does one API request: body (if not nil) sent as JSON, a 2xx
// response decoded into out (if not nil), anything else an *APIError.
func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.apiURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	pathOnly, _, _ := strings.Cut(path, "?")
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &APIError{Method: method, Path: pathOnly, StatusCode: resp.StatusCode}
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &eb) == nil && (eb.Code != 0 || eb.Message != "") {
			e.Code, e.Message = eb.Code, eb.Message
		} else {
			e.Message = strings.TrimSpace(string(b))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: bad response: %w", method, pathOnly, err)
		}
	}
	return nil
}

// upload PUTs a gzip'd tar of files to a (pre-signed) upload URL, with the
// headers the server gave and no API key.
func (c *Client) upload(ctx context.Context, fu fileUpload, files []contextFile, dir string) error {
	tmp, err := os.CreateTemp("", "warren-context-*.tar.gz")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := writeArchive(tmp, files, dir); err != nil {
		return fmt.Errorf("archiving the build context: %w", err)
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	target := fu.URL
	if strings.HasPrefix(target, "/") {
		target = c.apiURL + target
	}
	req, err := http.NewRequestWithContext(ctx, "PUT", target, io.NopCloser(tmp))
	if err != nil {
		return err
	}
	for k, v := range fu.Headers {
		if strings.EqualFold(k, "Content-Length") {
			continue
		}
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	req.ContentLength = size
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("uploading the build context: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("uploading the build context: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}
