package groupq

// bheap is a binary min-heap over a slice. Unlike container/heap it does not
// box elements in interfaces, so pushing a value does not allocate.
type bheap[E any] struct {
	s     []E
	less  func(a, b E) bool
	moved func(e E, i int) // optional: told each element's new index
}

func (h *bheap[E]) swap(i, j int) {
	h.s[i], h.s[j] = h.s[j], h.s[i]
	if h.moved != nil {
		h.moved(h.s[i], i)
		h.moved(h.s[j], j)
	}
}

func (h *bheap[E]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(h.s[j], h.s[i]) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h *bheap[E]) down(i0 int) bool {
	i, n := i0, len(h.s)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && h.less(h.s[r], h.s[j]) {
			j = r
		}
		if !h.less(h.s[j], h.s[i]) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}

func (h *bheap[E]) push(e E) {
	h.s = append(h.s, e)
	if h.moved != nil {
		h.moved(e, len(h.s)-1)
	}
	h.up(len(h.s) - 1)
}

func (h *bheap[E]) pop() E { return h.remove(0) }

func (h *bheap[E]) remove(i int) E {
	n := len(h.s) - 1
	if i != n {
		h.swap(i, n)
	}
	e := h.s[n]
	var zero E
	h.s[n] = zero
	h.s = h.s[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
	if h.moved != nil {
		h.moved(e, -1)
	}
	return e
}

func (h *bheap[E]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}
