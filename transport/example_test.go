package transport_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
)

// Any Go service can put the engine in front of its handlers.
func ExampleMiddleware() {
	rules, _ := regional.Parse("rules.yaml", []byte(`
rules:
  - { id: api, by: [api_key], algorithm: fixed_window, limit: 2, window: 1m }
`))
	engine := regional.New(regional.Config{}, rules)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	handler := transport.Middleware(engine, transport.MiddlewareOptions{})(hello)

	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/things", nil)
		r.Header.Set("X-API-Key", "acme")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 1
	// 200 0
	// 429 0
}
