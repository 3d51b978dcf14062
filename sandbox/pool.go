package sandbox

type pool struct{}

func (p *pool) drain() []*Sandbox { return nil }
