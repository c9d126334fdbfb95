// compose-check loads a Compose file with compose-go, the loader of `docker compose` v2, with
// its consistency checks (schema, references between services, volumes and networks,
// depends_on conditions), without a Docker engine. scripts/check-deploy.sh builds and runs it
// when Go is installed:
//
//	go build -o compose-check . && ./compose-check ../../deploy/compose.yaml
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: compose-check FILE")
		os.Exit(2)
	}
	opts, err := cli.NewProjectOptions([]string{os.Args[1]}, cli.WithOsEnv, cli.WithConsistency(true), cli.WithResolvedPaths(true))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	fmt.Printf("%s: valid compose project %q with services %v\n", os.Args[1], p.Name, p.ServiceNames())
}
