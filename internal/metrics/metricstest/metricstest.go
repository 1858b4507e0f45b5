// Package metricstest scrapes a Prometheus endpoint for tests: it parses
// the text exposition with the Prometheus parser (expfmt) and answers
// what a series' value is and which label values appear.
package metricstest

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Scrape GETs url (a /metrics endpoint) and parses its text exposition.
func Scrape(url string) (Families, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return Parse(resp.Body)
}

// Parse parses a text exposition.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	return Families(fams), err
}

// Value is the value of the series of name whose labels include every
// pair of labels ("name", "value", ...): a counter's or gauge's value, a
// histogram's sample count. ok is false if there is no such series; with
// several, their sum.
func (f Families) Value(name string, labels ...string) (v float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		ok = true
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			v += m.Untyped.GetValue()
		}
	}
	return v, ok
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Labels are the label names and, for each, the values that appear on
// the families whose name starts with prefix.
func (f Families) Labels(prefix string) map[string][]string {
	out := map[string][]string{}
	for name, fam := range f {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !slices.Contains(out[lp.GetName()], lp.GetValue()) {
					out[lp.GetName()] = append(out[lp.GetName()], lp.GetValue())
				}
			}
		}
	}
	return out
}

// Contains reports whether any label value of any family contains s (a
// sandbox or team ID, which must never be a label).
func (f Families) Contains(s string) (where string, found bool) {
	for name, fam := range f {
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), s) {
					return fmt.Sprintf("%s{%s=%q}", name, lp.GetName(), lp.GetValue()), true
				}
			}
		}
	}
	return "", false
}
