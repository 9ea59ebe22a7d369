// Command etcd is the etcd server at the version the pinned Kubernetes release requires (go.mod): the
// same code as upstream's etcd binary, whose main only hands its arguments to etcdmain.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
