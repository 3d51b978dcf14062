package trainer

import "fmt"

// Pack is a forest of token nodes: every sample is a root-to-node path.
// Packed (BuildPack with share), samples that begin with the same tokens (a
// GRPO group's prompt, earlier turns of a conversation) share those nodes, so
// the forward and backward passes compute them once; a node attends to
// exactly its ancestors, so its activations are the ones an unpacked causal
// pass would compute for that prefix.
type Pack struct {
	Tokens []int
	Pos    []int // depth of the node = position in every sample through it
	Parent []int // -1 for roots
	Trees  []tree
	// SampleNodes[s][t] is the node holding token t of sample s.
	SampleNodes [][]int
	// Segs cut the forest into chains that attention handles one at a
	// time: a segment's nodes see all of their ancestor segments and,
	// causally, each other, so no score is computed for a node that is not
	// an ancestor (a full square per tree would compute every branch
	// against every other branch).
	Segs []segment
}

// segment is a run of nodes [Start, Start+L) in which each node is the only
// child of the one before. Path lists the ancestor segments' node ranges,
// root first; all of them are wholly visible to every node of the segment.
type segment struct {
	Start, L int
	Path     [][2]int
	P        int // keys per query row: ancestor nodes + L
}

// tree is one connected component, stored contiguously, parents first. The
// passes work per segment; the ancestor matrix is the dense view of the same
// pattern (Pack.AncestorMask, for the gorgonia graph).
type tree struct {
	Start, N int
	// Anc[i*N+j] reports whether node Start+j is node Start+i or an ancestor.
	Anc []bool
}

// BuildPack lays out sequences. With share, common prefixes become one path
// (a trie); without, every sequence is its own chain (the unpacked baseline).
func BuildPack(seqs [][]int, share bool) (*Pack, error) {
	type key struct{ parent, token int }
	var (
		tokens, parent []int
		children       = map[int][]int{} // -1 = virtual root
		index          = map[key]int{}
		sampleNodes    = make([][]int, len(seqs))
	)
	for s, seq := range seqs {
		if len(seq) == 0 {
			return nil, fmt.Errorf("sample %d is empty", s)
		}
		p := -1
		for _, tok := range seq {
			k := key{p, tok}
			n, ok := index[k]
			if !ok || !share {
				n = len(tokens)
				tokens = append(tokens, tok)
				parent = append(parent, p)
				children[p] = append(children[p], n)
				if share {
					index[k] = n
				}
			}
			sampleNodes[s] = append(sampleNodes[s], n)
			p = n
		}
	}
	// Renumber depth-first so each tree is contiguous with parents first.
	newID := make([]int, len(tokens))
	pk := &Pack{SampleNodes: sampleNodes}
	var stack []int
	for _, root := range children[-1] {
		start := len(pk.Tokens)
		stack = append(stack[:0], root)
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			newID[n] = len(pk.Tokens)
			pk.Tokens = append(pk.Tokens, tokens[n])
			if parent[n] < 0 {
				pk.Parent = append(pk.Parent, -1)
				pk.Pos = append(pk.Pos, 0)
			} else {
				pp := newID[parent[n]]
				pk.Parent = append(pk.Parent, pp)
				pk.Pos = append(pk.Pos, pk.Pos[pp]+1)
			}
			ch := children[n]
			for i := len(ch) - 1; i >= 0; i-- {
				stack = append(stack, ch[i])
			}
		}
		n := len(pk.Tokens) - start
		t := tree{Start: start, N: n, Anc: make([]bool, n*n)}
		for i := 0; i < n; i++ {
			if p := pk.Parent[start+i]; p >= 0 {
				copy(t.Anc[i*n:i*n+n], t.Anc[(p-start)*n:(p-start)*n+n])
			}
			t.Anc[i*n+i] = true
		}
		pk.Trees = append(pk.Trees, t)
	}
	for s := range sampleNodes {
		for t, n := range sampleNodes[s] {
			sampleNodes[s][t] = newID[n]
		}
	}
	pk.Segs = buildSegments(pk.Parent)
	return pk, nil
}

func buildSegments(parent []int) []segment {
	nchild := make([]int, len(parent))
	for _, p := range parent {
		if p >= 0 {
			nchild[p]++
		}
	}
	var segs []segment
	segOf := make([]int, len(parent))
	for i, p := range parent {
		if p >= 0 && p == i-1 && nchild[p] == 1 {
			segs[len(segs)-1].L++
			segOf[i] = len(segs) - 1
			continue
		}
		sg := segment{Start: i, L: 1}
		if p >= 0 {
			// p ends its segment (it branches, or its only child is i and
			// DFS order put it right after p); that segment's path plus the
			// segment itself is ours.
			ps := segs[segOf[p]]
			sg.Path = append(append([][2]int{}, ps.Path...), [2]int{ps.Start, ps.Start + ps.L})
		}
		segOf[i] = len(segs)
		segs = append(segs, sg)
	}
	for i := range segs {
		segs[i].P = segs[i].L
		for _, r := range segs[i].Path {
			segs[i].P += r[1] - r[0]
		}
	}
	return segs
}

// NumNodes is the number of tokens the passes compute.
func (p *Pack) NumNodes() int { return len(p.Tokens) }

// NumSampleTokens is the number of tokens over all samples.
func (p *Pack) NumSampleTokens() int {
	n := 0
	for _, s := range p.SampleNodes {
		n += len(s)
	}
	return n
}
