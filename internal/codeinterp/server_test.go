package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run real ipykernels with the host's Debian Python
// (python3-ipykernel and python3-jupyter-client; scripts/install-deps.sh
// installs them).

const testToken = "secret-token"

func newTestServer(t *testing.T, mod func(*Config)) (*Server, *httptest.Server) {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-c", "import jupyter_client, ipykernel").CombinedOutput(); err != nil {
		t.Fatalf("the host lacks Debian's python3-jupyter-client/python3-ipykernel (scripts/install-deps.sh installs them): %v\n%s", err, out)
	}
	cfg := Config{
		RunDir:    t.TempDir(),
		Authorize: func(tok string) bool { return tok == testToken },
		Env:       func() map[string]string { return map[string]string{"SANDBOX_WIDE": "yes"} },
		// The host's memory is not a sandbox's: the guard's tests give it
		// a fake view (memguard_test.go).
		MemoryCheckInterval: -1,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.Close()
		s.Close()
	})
	return s, hs
}

type event map[string]any

func (e event) str(k string) string { v, _ := e[k].(string); return v }

type execution struct {
	events []event
}

func (x execution) of(typ string) []event {
	var out []event
	for _, e := range x.events {
		if e["type"] == typ {
			out = append(out, e)
		}
	}
	return out
}

func (x execution) text() string {
	for _, e := range x.of("result") {
		if e["is_main_result"] == true {
			return e.str("text")
		}
	}
	return ""
}

func (x execution) stdout() string { return x.joined("stdout") }

func (x execution) joined(typ string) string {
	var b strings.Builder
	for _, e := range x.of(typ) {
		b.WriteString(e.str("text"))
	}
	return b.String()
}

func post(t *testing.T, ctx context.Context, url string, body any, token string) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func run(t *testing.T, hs *httptest.Server, body map[string]any) execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := post(t, ctx, hs.URL+"/execute", body, testToken)
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("execute %v: %d %s", body, res.StatusCode, b)
	}
	var x execution
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("a line that is not JSON: %q", sc.Text())
		}
		x.events = append(x.events, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n := len(x.events); n == 0 || x.events[n-1]["type"] != "end_of_execution" {
		t.Fatalf("the stream did not end with end_of_execution: %v", x.events)
	}
	return x
}

func code(c string) map[string]any { return map[string]any{"code": c} }

func TestExecuteValueStateOutputAndErrors(t *testing.T) {
	_, hs := newTestServer(t, nil)

	x := run(t, hs, code("x = 41\nx + 1"))
	if got := x.text(); got != "42" {
		t.Fatalf("text = %q, want 42 (events %v)", got, x.events)
	}
	if n := x.of("number_of_executions"); len(n) != 1 || n[0]["execution_count"] != float64(1) {
		t.Errorf("number_of_executions = %v", n)
	}
	if got := run(t, hs, code("x * 2")).text(); got != "82" {
		t.Errorf("state across cells: %q, want 82", got)
	}
	if got := run(t, hs, code("'a string'")).text(); got != "a string" {
		t.Errorf("a string's text = %q, want it without quotes", got)
	}

	x = run(t, hs, code("import sys\nprint('out1')\nprint('err1', file=sys.stderr)"))
	if got := x.stdout(); got != "out1\n" {
		t.Errorf("stdout = %q", got)
	}
	if e := x.of("stderr"); len(e) != 1 || e[0].str("text") != "err1\n" || e[0].str("timestamp") == "" {
		t.Errorf("stderr = %v", e)
	}

	x = run(t, hs, code("def f():\n    raise ValueError('bad value')\nf()"))
	errs := x.of("error")
	if len(errs) != 1 {
		t.Fatalf("errors = %v", x.events)
	}
	if errs[0].str("name") != "ValueError" || errs[0].str("value") != "bad value" || !strings.Contains(errs[0].str("traceback"), "bad value") {
		t.Errorf("error = %v", errs[0])
	}

	x = run(t, hs, code("from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))\n7"))
	var display, main event
	for _, e := range x.of("result") {
		if e["is_main_result"] == true {
			main = e
		} else {
			display = e
		}
	}
	if display.str("html") != "<b>hi</b>" || main.str("text") != "7" {
		t.Errorf("results = %v", x.of("result"))
	}
}

func TestExecuteEnvVarsApplyToOneRun(t *testing.T) {
	_, hs := newTestServer(t, nil)
	x := run(t, hs, map[string]any{"code": "import os\nos.environ.get('RUN_ONLY'), os.environ['SANDBOX_WIDE']", "env_vars": map[string]string{"RUN_ONLY": "v1", "SANDBOX_WIDE": "override"}})
	if got := x.text(); got != "('v1', 'override')" {
		t.Fatalf("with env_vars: %q (events %v)", got, x.events)
	}
	if got := run(t, hs, code("import os\nos.environ.get('RUN_ONLY'), os.environ['SANDBOX_WIDE']")).text(); got != "(None, 'yes')" {
		t.Fatalf("the next run: %q, want the run's variables gone and the sandbox's back", got)
	}
}

// A kernel started before the platform set the sandbox's variables (a
// warm sandbox, claimed later) gets them with its next cell.
func TestSandboxEnvSetAfterTheKernelStarted(t *testing.T) {
	var mu sync.Mutex
	sandboxEnv := map[string]string{"SANDBOX_WIDE": "yes"}
	_, hs := newTestServer(t, func(c *Config) {
		c.Env = func() map[string]string { mu.Lock(); defer mu.Unlock(); return maps.Clone(sandboxEnv) }
	})
	check := `import os; os.environ.get("SANDBOX_WIDE"), os.environ.get("LATE")`
	if got := run(t, hs, code(check)).text(); got != "('yes', None)" {
		t.Fatalf("before: %q", got)
	}
	if got := run(t, hs, map[string]any{"code": "echo ${LATE:-unset}", "language": "bash"}).stdout(); got != "unset\n" {
		t.Fatalf("bash before: %q", got)
	}
	mu.Lock()
	sandboxEnv["LATE"] = "set by /init"
	mu.Unlock()
	for i := 0; i < 2; i++ { // and it stays
		if got := run(t, hs, code(check)).text(); got != "('yes', 'set by /init')" {
			t.Fatalf("after #%d: %q", i, got)
		}
		if got := run(t, hs, map[string]any{"code": "echo ${LATE:-unset}", "language": "bash"}).stdout(); got != "set by /init\n" {
			t.Fatalf("bash after #%d: %q", i, got)
		}
	}
	// A run's own variable of that name wins for the run, then it is back.
	if got := run(t, hs, map[string]any{"code": check, "env_vars": map[string]string{"LATE": "run"}}).text(); got != "('yes', 'run')" {
		t.Fatalf("run override: %q", got)
	}
	if got := run(t, hs, code(check)).text(); got != "('yes', 'set by /init')" {
		t.Fatalf("after the override: %q", got)
	}
}

func TestContexts(t *testing.T) {
	_, hs := newTestServer(t, nil)
	dir := t.TempDir()
	res := post(t, context.Background(), hs.URL+"/contexts", map[string]string{"language": "python", "cwd": dir}, "")
	var c struct{ ID, Language, Cwd string }
	json.NewDecoder(res.Body).Decode(&c)
	res.Body.Close()
	if res.StatusCode != 200 || c.ID == "" || c.Language != "python" || c.Cwd != dir {
		t.Fatalf("create: %d %+v", res.StatusCode, c)
	}
	if got := run(t, hs, map[string]any{"code": "import os\nos.getcwd()", "context_id": c.ID}).text(); got != dir {
		t.Errorf("cwd = %q, want %q", got, dir)
	}
	run(t, hs, map[string]any{"code": "y = 5", "context_id": c.ID})
	if x := run(t, hs, code("y")); len(x.of("error")) != 1 || x.of("error")[0].str("name") != "NameError" {
		t.Errorf("the default context sees another context's variable: %v", x.events)
	}
	if got := run(t, hs, map[string]any{"code": "y", "context_id": c.ID}).text(); got != "5" {
		t.Errorf("y = %q in its context", got)
	}

	res, _ = http.Get(hs.URL + "/contexts")
	var list []struct{ ID string }
	json.NewDecoder(res.Body).Decode(&list)
	res.Body.Close()
	found := false
	for _, l := range list {
		found = found || l.ID == c.ID
	}
	if !found || len(list) != 2 {
		t.Errorf("list = %+v, want the default context and %s", list, c.ID)
	}

	res = post(t, context.Background(), hs.URL+"/contexts/"+c.ID+"/restart", nil, "")
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("restart: %d", res.StatusCode)
	}
	if x := run(t, hs, map[string]any{"code": "y", "context_id": c.ID}); len(x.of("error")) != 1 {
		t.Errorf("y survived a restart: %v", x.events)
	}

	req, _ := http.NewRequest("DELETE", hs.URL+"/contexts/"+c.ID, nil)
	res, _ = http.DefaultClient.Do(req)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("remove: %d", res.StatusCode)
	}
	res = post(t, context.Background(), hs.URL+"/execute", map[string]any{"code": "1", "context_id": c.ID}, testToken)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 404 || string(b) != "Context "+c.ID+" not found" {
		t.Errorf("execute in a removed context: %d %q", res.StatusCode, b)
	}
	req, _ = http.NewRequest("DELETE", hs.URL+"/contexts/"+c.ID, nil)
	res, _ = http.DefaultClient.Do(req)
	res.Body.Close()
	if res.StatusCode != 404 {
		t.Errorf("remove twice: %d", res.StatusCode)
	}
}

func TestContextBadInput(t *testing.T) {
	_, hs := newTestServer(t, func(c *Config) { c.MaxContexts = 2 })
	for _, tc := range []struct {
		body map[string]string
		want int
	}{
		{map[string]string{"cwd": "relative/dir"}, 400},
		{map[string]string{"cwd": "/no/such/dir"}, 500},
		{map[string]string{"language": "cobol"}, 400},
	} {
		res := post(t, context.Background(), hs.URL+"/contexts", tc.body, "")
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("create %v: %d %s, want %d", tc.body, res.StatusCode, b, tc.want)
		}
	}
	for i, want := range []int{200, 200, 429} {
		res := post(t, context.Background(), hs.URL+"/contexts", nil, "")
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("create #%d: %d, want %d", i, res.StatusCode, want)
		}
	}
}

func TestExecuteAuthAndBadRequests(t *testing.T) {
	_, hs := newTestServer(t, nil)
	for _, tok := range []string{"", "wrong"} {
		res := post(t, context.Background(), hs.URL+"/execute", code("1"), tok)
		res.Body.Close()
		if res.StatusCode != 401 {
			t.Errorf("token %q: %d, want 401", tok, res.StatusCode)
		}
	}
	for _, tc := range []struct {
		body map[string]any
		want int
	}{
		{map[string]any{"code": "1", "context_id": "x", "language": "python"}, 400},
		{map[string]any{"code": "1", "context_id": "nope"}, 404},
		{map[string]any{"code": "1", "language": "cobol"}, 400},
		{map[string]any{"code": "1", "env_vars": map[string]string{"A=B": "x"}}, 400},
	} {
		res := post(t, context.Background(), hs.URL+"/execute", tc.body, testToken)
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%v: %d, want %d", tc.body, res.StatusCode, tc.want)
		}
	}
}

// A client that gives up on a long cell interrupts it: the next cell runs
// at once in the same kernel, whose state is kept.
func TestDisconnectInterruptsTheCell(t *testing.T) {
	_, hs := newTestServer(t, nil)
	run(t, hs, code("kept = 'still here'"))
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, hs.URL+"/execute", code("import time\nprint('started', flush=True)\ntime.sleep(600)"), testToken)
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), "started") {
	}
	cancel()
	res.Body.Close()

	done := make(chan execution, 1)
	go func() { done <- run(t, hs, code("kept")) }()
	select {
	case x := <-done:
		if x.text() != "still here" {
			t.Fatalf("after the interrupt: %v", x.events)
		}
	case <-time.After(60 * time.Second): // far beyond the 600 s cell's interrupt, far below its end
		t.Fatal("the next cell waited for the abandoned one")
	}
}

// A cell that swallows the first interrupt (its own SIGINT handler) is
// interrupted again, and stops well before DrainTimeout would kill its
// kernel: the kernel's state is kept.
func TestAbandonedCellIsInterruptedAgain(t *testing.T) {
	_, hs := newTestServer(t, func(c *Config) { c.DrainTimeout = 20 * time.Second })
	run(t, hs, code("kept = 'still here'"))
	cell := "import signal, time\n" +
		"seen = []\n" +
		"def swallow_first(*a):\n" +
		"    seen.append(1)\n" +
		"    if len(seen) > 1:\n" +
		"        raise KeyboardInterrupt\n" +
		"signal.signal(signal.SIGINT, swallow_first)\n" +
		"print('started', flush=True)\n" +
		"while True:\n" +
		"    time.sleep(0.05)"
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, hs.URL+"/execute", code(cell), testToken)
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), "started") {
	}
	cancel()
	res.Body.Close()
	start := time.Now()
	x := run(t, hs, code("(kept, len(seen))"))
	if x.text() != "('still here', 2)" {
		t.Fatalf("after the interrupts: %v (%s later)", x.events, time.Since(start))
	}
}

// A kernel that dies (here: kills itself) ends its cell with an error, and
// the context gets a new kernel.
func TestKernelDeath(t *testing.T) {
	_, hs := newTestServer(t, nil)
	x := run(t, hs, code("import os, signal\nz = 1\nos.kill(os.getpid(), signal.SIGKILL)"))
	errs := x.of("error")
	if len(errs) != 1 || errs[0].str("name") != "KernelDied" {
		t.Fatalf("events = %v", x.events)
	}
	if x := run(t, hs, code("'z' in dir(), 1 + 1")); x.text() != "(False, 2)" {
		t.Fatalf("after the death: %v", x.events)
	}
	// The bridge itself dying (the user's code can kill it: same user).
	x = run(t, hs, code("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(5)"))
	if errs := x.of("error"); len(errs) != 1 || errs[0].str("name") != "UnexpectedEndOfExecution" {
		t.Fatalf("bridge death: %v", x.events)
	}
	if x := run(t, hs, code("3")); x.text() != "3" {
		t.Fatalf("after the bridge's death: %v", x.events)
	}
}

func TestOutputIsBounded(t *testing.T) {
	_, hs := newTestServer(t, func(c *Config) {
		c.MaxLineBytes = 64 << 10
		c.MaxOutputBytes = 1 << 20
	})
	x := run(t, hs, code("'x' * 200000"))
	if x.text() != "" || !strings.Contains(x.events[len(x.events)-2].str("text"), "larger than") {
		t.Errorf("a result over MaxLineBytes: %v", x.events)
	}
	x = run(t, hs, code("for i in range(400):\n    print('y' * 10000, flush=True)"))
	total := 0
	notes := 0
	for _, e := range x.of("stdout") {
		total += len(e.str("text"))
	}
	for _, e := range x.of("stderr") {
		if strings.Contains(e.str("text"), "output passed") {
			notes++
		}
	}
	if total > 1<<20 || total == 0 || notes != 1 {
		t.Errorf("stdout bytes %d (bound %d), notes %d", total, 1<<20, notes)
	}
	if got := run(t, hs, code("1 + 1")).text(); got != "2" {
		t.Errorf("after a huge output: %q", got)
	}
}

// A cell that writes far more than the bound at once (ipykernel sends
// what it buffered in one message: megabytes) comes out as small events up
// to the bound, then one note; the stream ends properly and the next cell
// runs. Python and bash alike.
func TestHugeOutputIsCutIntoSmallEventsUpToTheBound(t *testing.T) {
	const bound = 4 << 20
	_, hs := newTestServer(t, func(c *Config) {
		c.MaxLineBytes = 1 << 20
		c.MaxOutputBytes = bound
	})
	for _, tc := range []struct{ language, code string }{
		{"python", "import sys\nline = 'x' * 999 + '\\n'\nfor i in range(20_000):\n    sys.stdout.write(line)"},
		{"bash", "yes \"$(head -c 999 /dev/zero | tr '\\0' b)\" | head -n 20000"},
	} {
		x := run(t, hs, map[string]any{"code": tc.code, "language": tc.language})
		total, biggest := 0, 0
		for _, e := range x.of("stdout") {
			n := len(e.str("text"))
			total += n
			biggest = max(biggest, n)
		}
		notes := 0
		for _, e := range x.of("stderr") {
			if strings.Contains(e.str("text"), "[warren") {
				notes++
			}
		}
		if total > bound || total < bound/2 || notes != 1 || biggest > 256<<10 || len(x.of("error")) != 0 {
			t.Errorf("%s: %d stdout bytes (bound %d), biggest event %d bytes, %d notes, errors %v",
				tc.language, total, bound, biggest, notes, x.of("error"))
		}
		next := map[string]any{"code": "1 + 1", "language": tc.language}
		if tc.language == "bash" {
			next["code"] = "echo 2"
		}
		if x := run(t, hs, next); x.text() != "2" && x.stdout() != "2\n" {
			t.Errorf("%s: after a huge output: %v", tc.language, x.events)
		}
	}
}

// What a cell writes into its bridge's stdout itself (the same user may
// open /proc/<bridge>/fd/1) never reaches the client unless it is JSON.
func TestLinesForgedByACellStayValidJSON(t *testing.T) {
	_, hs := newTestServer(t, nil)
	x := run(t, hs, code("import os\nfd = os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY)\n"+
		"os.write(fd, b'not json\\n{\"type\": \"end\"} trailing\\n')\nos.close(fd)\n'after'"))
	if x.text() != "after" {
		t.Errorf("events = %v", x.events)
	}
}

func TestBashCells(t *testing.T) {
	_, hs := newTestServer(t, nil)
	bash := func(c string, env map[string]string) execution {
		return run(t, hs, map[string]any{"code": c, "language": "bash", "env_vars": env})
	}
	x := bash("GREETING=hello\ncd /tmp\necho \"$GREETING\"\necho oops >&2\nprintf 'no newline'", nil)
	if got := x.stdout(); got != "hello\nno newline" {
		t.Errorf("stdout = %q (events %v)", got, x.events)
	}
	if got := x.joined("stderr"); got != "oops\n" {
		t.Errorf("stderr = %q", got)
	}
	if len(x.of("error")) != 0 {
		t.Errorf("errors: %v", x.of("error"))
	}
	if got := bash("echo \"$GREETING $(pwd) ${RUN_ONLY:-unset} $SANDBOX_WIDE\"", map[string]string{"RUN_ONLY": "it's set", "SANDBOX_WIDE": "over"}).stdout(); got != "hello /tmp it's set over\n" {
		t.Errorf("state and env vars: %q", got)
	}
	if got := bash("echo \"${RUN_ONLY:-unset} $SANDBOX_WIDE\"", nil).stdout(); got != "unset yes\n" {
		t.Errorf("after the run with env vars: %q", got)
	}
	x = bash("false", nil)
	if e := x.of("error"); len(e) != 1 || e[0].str("value") != "exit status 1" {
		t.Errorf("a failing command: %v", x.events)
	}

	// A client that gives up interrupts the cell; the shell lives on.
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, hs.URL+"/execute", map[string]any{"code": "echo started; sleep 600; echo not reached", "language": "bash"}, testToken)
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), "started") {
	}
	cancel()
	res.Body.Close()
	done := make(chan execution, 1)
	go func() { done <- bash("echo $GREETING", nil) }()
	select {
	case x := <-done:
		if x.stdout() != "hello\n" {
			t.Fatalf("after the interrupt: %v", x.events)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the next bash cell waited for the abandoned one")
	}
	// exit ends the shell: an error, then a new shell.
	if e := bash("exit 3", nil).of("error"); len(e) != 1 {
		t.Errorf("exit: %v", e)
	}
	if got := bash("echo ${GREETING:-fresh}", nil).stdout(); got != "fresh\n" {
		t.Errorf("after exit: %q (%v)", got, bash("echo again", nil).events)
	}
}

func TestJavaScriptCells(t *testing.T) {
	_, hs := newTestServer(t, nil)
	js := func(c string, env map[string]string) execution {
		return run(t, hs, map[string]any{"code": c, "language": "js", "env_vars": env})
	}
	x := js("const a = 20; let b = 1\nconsole.log('hi', a)\na + b + 21", nil)
	if x.text() != "42" || x.stdout() != "hi 20\n" {
		t.Errorf("first cell: %v", x.events)
	}
	if got := js("b += 1; [a, b, process.env.RUN_ONLY, process.env.SANDBOX_WIDE]", map[string]string{"RUN_ONLY": "r"}).text(); got != "[ 20, 2, 'r', 'yes' ]" {
		t.Errorf("state and env: %q", got)
	}
	if got := js("String(process.env.RUN_ONLY)", nil).text(); got != "undefined" {
		t.Errorf("after the run: %q", got)
	}
	if got := js("Promise.resolve(7)", nil).text(); got != "7" {
		t.Errorf("a promise: %q", got)
	}
	x = js("function f() { throw new TypeError('bad') }\nf()", nil)
	if e := x.of("error"); len(e) != 1 || e[0].str("name") != "TypeError" || e[0].str("value") != "bad" || !strings.Contains(e[0].str("traceback"), "at f") {
		t.Errorf("an exception: %v", x.events)
	}
	// A client that gives up interrupts a busy loop; the context lives on.
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, hs.URL+"/execute", map[string]any{"code": "console.log('started'); while (true) {}", "language": "javascript"}, testToken)
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), "started") {
	}
	cancel()
	res.Body.Close()
	if got := js("a", nil).text(); got != "20" {
		t.Errorf("after the interrupt: %q", got)
	}
}

func TestHealth(t *testing.T) {
	_, hs := newTestServer(t, nil)
	res, err := http.Get(hs.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || strings.TrimSpace(string(b)) != `"OK"` {
		t.Errorf("health: %d %s", res.StatusCode, b)
	}
}

func TestMain(m *testing.M) {
	os.Exit(m.Run())
}

func TestTypeScriptCells(t *testing.T) {
	_, hs := newTestServer(t, nil)
	ts := func(c string) execution {
		return run(t, hs, map[string]any{"code": c, "language": "ts"})
	}
	x := ts("interface P { n: number }\nconst p: P = { n: 40 }\nconsole.log('typed', p.n)\np.n + 2")
	if x.text() != "42" || x.stdout() != "typed 40\n" {
		t.Errorf("first cell: %v", x.events)
	}
	// State carries over; an import becomes a require.
	if got := ts("import { basename } from 'path'\nconst q: string = basename('/a/b.txt');\n`${p.n} ${q}`").text(); got != "40 b.txt" {
		t.Errorf("state and an import: %q", got)
	}
	// Types are stripped, not checked (E2B's TypeScript kernel does the same).
	if got := ts("const s: number = 'not a number' as any\ns").text(); got != "not a number" {
		t.Errorf("a mistyped value: %q", got)
	}
	x = ts("const bad: = 1")
	if e := x.of("error"); len(e) != 1 || e[0].str("name") != "SyntaxError" || !strings.Contains(e[0].str("value"), "(1:12)") || !strings.Contains(e[0].str("traceback"), "TS1110") {
		t.Errorf("a cell that does not parse: %v", x.events)
	}
	x = ts("function f(): never { throw new RangeError('out') }\nf()")
	if e := x.of("error"); len(e) != 1 || e[0].str("name") != "RangeError" || e[0].str("value") != "out" || !strings.Contains(e[0].str("traceback"), "at f") {
		t.Errorf("an exception: %v", x.events)
	}
	// A TypeScript context of its own is not the default one.
	if got := run(t, hs, map[string]any{"code": "typeof p", "language": "javascript"}).text(); got != "undefined" {
		t.Errorf("the JavaScript context sees the TypeScript one's state: %q", got)
	}
}

func TestRCells(t *testing.T) {
	if _, err := exec.LookPath("R"); err != nil {
		t.Fatalf("the host lacks Debian's r-base-core and r-cran-irkernel (scripts/install-deps.sh installs them): %v", err)
	}
	_, hs := newTestServer(t, nil)
	r := func(c string, env map[string]string) execution {
		return run(t, hs, map[string]any{"code": c, "language": "r", "env_vars": env})
	}
	x := r("x <- 41\nprint('hi')\nx + 1", nil)
	if got := x.of("result"); len(got) != 1 || got[0].str("text") != "[1] 42" || x.stdout() != "[1] \"hi\"\n" {
		t.Errorf("first cell: %v", x.events)
	}
	// State, a per-run variable (with a quote in it) and the sandbox's.
	x = r("c(x, Sys.getenv('RUN_ONLY'), Sys.getenv('SANDBOX_WIDE'))", map[string]string{"RUN_ONLY": `a"b`})
	if got := x.of("result"); len(got) != 1 || got[0].str("text") != `[1] "41"   "a\"b" "yes" ` {
		t.Errorf("state and env: %v", x.events)
	}
	if got := r("Sys.getenv('RUN_ONLY', unset = 'gone')", nil).of("result"); len(got) != 1 || got[0].str("text") != `[1] "gone"` {
		t.Errorf("after the run: %v", got)
	}
	x = r("f <- function() stop('boom')\nf()", nil)
	if e := x.of("error"); len(e) != 1 || e[0].str("name") != "ERROR" || !strings.Contains(e[0].str("value"), "boom") || !strings.Contains(e[0].str("traceback"), "f()") {
		t.Errorf("an error: %v", x.events)
	}
	x = r("data.frame(a = 1:2, b = c('x', 'y'))", nil)
	if got := x.of("result"); len(got) != 1 || !strings.Contains(got[0].str("html"), "<table") || !strings.Contains(got[0].str("text"), "a b") {
		t.Errorf("a data.frame: %v", x.events)
	}
}

// Interrupts sent at any moment, between cells and many times while one
// runs (a client that gives up, the server's repeats), end a JavaScript
// cell and never its context: Node dies of a SIGINT that lands while the
// vm swaps its handlers, just before or after the cell's code runs.
func TestInterruptsNeverKillAJavaScriptContext(t *testing.T) {
	s, hs := newTestServer(t, nil)
	js := func(c string) execution {
		return run(t, hs, map[string]any{"code": c, "language": "js"})
	}
	if x := js("globalThis.alive = 'yes'"); len(x.of("error")) != 0 {
		t.Fatalf("first cell: %v", x.events)
	}
	c, err := s.defaultContext("javascript")
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	k := c.k
	c.mu.Unlock()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
				k.interrupt()
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for i := 0; i < 20; i++ {
		x := js("while (true) {}")
		if e := x.of("error"); len(e) != 1 || !strings.Contains(e[0].str("value"), "interrupted") {
			t.Fatalf("cell %d: %v", i, x.events)
		}
	}
	if got := js("alive").text(); !strings.Contains(got, "yes") {
		t.Errorf("after the interrupts: %q, want 'yes' (one context throughout)", got)
	}
}
