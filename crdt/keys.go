package crdt

import "sync"

// Keys go by number in keyed deltas (AppendDeltaKeyed): a sender numbers
// the keys it sends, sends each with its number once, and by its number
// alone after that; a receiver learns the numbers of each sender's keys
// (KeyNames) as they come. A key is most of what a changed counter costs on
// the wire (a tenant's API key is two dozen characters that do not
// compress), and the same keys change window after window.
//
// A receiver that missed the message that numbered a key cannot read an
// entry that names it by number: DecodeDeltaKeyed leaves it out and says
// so, and the receiver asks for what changed since (an answer sends every
// key in full, with its number).

// maxKeyNumber bounds the numbers a keyed delta may carry.
const maxKeyNumber = 1 << 24

// KeyNumbers is a sender's numbering of its keys. Safe for concurrent use.
type KeyNumbers struct {
	mu      sync.Mutex
	numbers map[string]uint32
	sent    []bool // by number: sent in full with it at least once
	max     int
}

// NewKeyNumbers returns an empty numbering that numbers at most max keys
// (at most 2^24); the keys after those go in full.
func NewKeyNumbers(max int) *KeyNumbers {
	return &KeyNumbers{numbers: map[string]uint32{}, max: min(max, maxKeyNumber)}
}

// Len returns the number of keys numbered.
func (t *KeyNumbers) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.numbers)
}

// KeyNames is what a receiver learned of one sender's numbering, within
// a budget of key bytes it shares with the others. Not safe for
// concurrent use.
type KeyNames struct {
	keys   map[uint32]string
	bytes  int
	budget *KeyBudget
}

// NewKeyNames returns an empty table that takes its room from budget.
func NewKeyNames(budget *KeyBudget) *KeyNames {
	return &KeyNames{keys: map[uint32]string{}, budget: budget}
}

// Len returns the number of keys learned.
func (n *KeyNames) Len() int { return len(n.keys) }

// keyCost is what a key learned costs its budget beyond its bytes: the
// map's slot and the string's header, about.
const keyCost = 48

// learn notes a key's number, if the budget has room for it.
func (n *KeyNames) learn(number uint32, key string) {
	if _, ok := n.keys[number]; ok {
		return
	}
	if !n.budget.take(len(key) + keyCost) {
		return
	}
	n.keys[number] = key
	n.bytes += len(key) + keyCost
}

// Release gives the table's room back to its budget and empties it: its
// sender is forgotten.
func (n *KeyNames) Release() {
	n.budget.give(n.bytes)
	n.keys, n.bytes = map[uint32]string{}, 0
}

// KeyBudget bounds the memory the KeyNames that share it may hold. Safe
// for concurrent use.
type KeyBudget struct {
	mu   sync.Mutex
	left int
}

// NewKeyBudget returns a budget of about the given number of bytes.
func NewKeyBudget(bytes int) *KeyBudget { return &KeyBudget{left: bytes} }

// Left returns the bytes still free.
func (b *KeyBudget) Left() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.left
}

func (b *KeyBudget) take(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.left {
		return false
	}
	b.left -= n
	return true
}

func (b *KeyBudget) give(n int) {
	b.mu.Lock()
	b.left += n
	b.mu.Unlock()
}
