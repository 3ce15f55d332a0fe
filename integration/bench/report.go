package main

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// report is one backend's results.
type report struct {
	backend *backend
	o       options
	started time.Time
	results []result
}

// ref returns the result that of's ratios divide by, if measured: the
// system named by of.refName, else the reference (raw client), on the
// same number of keys.
func (r *report) ref(of result) (result, bool) {
	for _, res := range r.results {
		if res.keys == of.keys && (of.refName == "" && res.ref || of.refName != "" && res.system == of.refName) {
			return res, true
		}
	}
	return result{}, false
}

func ratio(a, b float64, ok bool) string {
	if !ok || a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func rate(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	// Thousands separators for the tables.
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// markdown returns the backend's table with a line saying what ran.
func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", r.backend.title)
	fmt.Fprintf(&b, "%s messages of %d B per run, %s UTC, %d round(s) (medians). %s\n\n",
		rate(float64(r.o.n)), r.o.size, r.started.UTC().Format("2006-01-02 15:04"), max(r.o.rounds, 1), r.backend.note)
	fmt.Fprintln(&b, "| keys | system | publish msgs/s | consume msgs/s | end-to-end msgs/s | publish ×raw | consume ×raw | end-to-end ×raw | order violations | duplicates | load avg |")
	fmt.Fprintln(&b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, res := range r.results {
		ref, ok := r.ref(res)
		ok = ok && !res.ref
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %d | %d | %.2f |\n",
			res.keys, res.system, rate(res.publish), rate(res.consume), rate(res.e2e),
			ratio(res.publish, ref.publish, ok), ratio(res.consume, ref.consume, ok), ratio(res.e2e, ref.e2e, ok),
			res.violations, res.dups, res.load)
	}
	return b.String()
}

// check fails when keyorder broke per-key order.
func (r *report) check() error {
	for _, res := range r.results {
		if strings.HasPrefix(res.system, "keyorder") && res.violations > 0 {
			return fmt.Errorf("%s, %d keys: %d order violations", res.system, res.keys, res.violations)
		}
	}
	return nil
}

var palette = []color.Color{
	color.RGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff}, // the raw client: grey
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
}

// chart writes a grouped bar chart of msgs/s: one group per phase and key
// count, one bar per system.
func (r *report) chart(path string) error {
	var systems []string
	var keys []int
	for _, res := range r.results {
		if !slices.Contains(systems, res.system) {
			systems = append(systems, res.system)
		}
		if !slices.Contains(keys, res.keys) {
			keys = append(keys, res.keys)
		}
	}
	var labels []string
	for _, k := range keys {
		labels = append(labels, fmt.Sprintf("publish\n%d keys", k), fmt.Sprintf("consume\n%d keys", k), fmt.Sprintf("end-to-end\n%d keys", k))
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %s messages of %d B", r.backend.title, rate(float64(r.o.n)), r.o.size)
	p.Y.Label.Text = "msgs/s"
	p.Y.Min = 0
	w := vg.Points(float64(min(14, 60/max(len(systems), 1))))
	for si, sys := range systems {
		vals := make(plotter.Values, len(labels))
		for ki, k := range keys {
			for _, res := range r.results {
				if res.system == sys && res.keys == k {
					vals[3*ki], vals[3*ki+1], vals[3*ki+2] = res.publish, res.consume, res.e2e
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = palette[si%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(si)-float64(len(systems)-1)/2)
		p.Add(bars)
		p.Legend.Add(sys, bars)
	}
	// A log scale when the systems differ by orders of magnitude (the
	// memory backend's channel), so every bar stays visible.
	lo, hi := p.Y.Max, p.Y.Max
	for _, res := range r.results {
		for _, v := range []float64{res.publish, res.consume, res.e2e} {
			if v > 0 {
				lo = min(lo, v)
			}
		}
	}
	if lo > 0 && hi/lo > 30 {
		p.Y.Scale = floorLog{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo)))
		p.Y.Max = hi * 8
		p.Y.Label.Text = "msgs/s (log scale)"
	} else {
		p.Y.Max = hi * 1.3 // room for the legend
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.NominalX(labels...)
	p.Add(plotter.NewGrid())
	return p.Save(vg.Length(max(5, 2.2*float64(len(labels))))*vg.Inch, 4.5*vg.Inch, path)
}

// floorLog is a log scale that draws values below the axis' minimum (a
// bar's base at 0) at the minimum.
type floorLog struct{}

func (floorLog) Normalize(lo, hi, x float64) float64 {
	x = max(x, lo)
	return math.Log(x/lo) / math.Log(hi/lo)
}
