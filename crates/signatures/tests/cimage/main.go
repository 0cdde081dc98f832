// cimage: the test oracle of the signatures crate. It does what skopeo 1.9's `copy` does
// with containers/image 5.23.1 built as upstream ships it (Debian's build of skopeo and
// podman has sigstore signing and verification patched out): evaluate a policy for a
// docker:// image the way copy.Image does before copying it, and copy an image while
// signing it with a sigstore private key.
//
//	cimage check --policy FILE --registries.d DIR docker://IMAGE
//	    exit 0: accepted; 1: refused (the reason on stderr); 2: another error
//	cimage copy --registries.d DIR [--sign-by-sigstore-private-key KEY
//	    --sign-passphrase-file FILE [--sign-identity REF]] SRC DEST
//	cimage parse-policy FILE
//	    exit 0: the policy parses; 1: it does not (why on stderr)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/containers/image/v5/copy"
	"github.com/containers/image/v5/docker/reference"
	"github.com/containers/image/v5/image"
	"github.com/containers/image/v5/signature"
	"github.com/containers/image/v5/transports/alltransports"
	"github.com/containers/image/v5/types"
)

func fail(code int, format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

func main() {
	if len(os.Args) < 2 {
		fail(2, "usage: cimage check|copy ...")
	}
	ctx := context.Background()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	policyPath := fs.String("policy", "", "policy.json")
	regd := fs.String("registries.d", "", "registries.d directory")
	key := fs.String("sign-by-sigstore-private-key", "", "private key")
	passFile := fs.String("sign-passphrase-file", "", "passphrase file")
	identity := fs.String("sign-identity", "", "signed identity")
	_ = fs.Parse(os.Args[2:])
	// Plain HTTP to the test registry, as --tls-verify=false lets skopeo fall back to it.
	sys := &types.SystemContext{
		RegistriesDirPath:           *regd,
		DockerInsecureSkipTLSVerify: types.OptionalBoolTrue,
	}
	switch os.Args[1] {
	case "parse-policy":
		if fs.NArg() != 1 {
			fail(2, "parse-policy: one file")
		}
		if _, err := signature.NewPolicyFromFile(fs.Arg(0)); err != nil {
			fail(1, "%v", err)
		}
	case "check":
		if fs.NArg() != 1 {
			fail(2, "check: one image")
		}
		policy, err := signature.NewPolicyFromFile(*policyPath)
		if err != nil {
			fail(1, "policy: %v", err)
		}
		pc, err := signature.NewPolicyContext(policy)
		if err != nil {
			fail(2, "%v", err)
		}
		ref, err := alltransports.ParseImageName(fs.Arg(0))
		if err != nil {
			fail(2, "%v", err)
		}
		src, err := ref.NewImageSource(ctx, sys)
		if err != nil {
			fail(2, "%v", err)
		}
		defer src.Close()
		// copy.Image's check of the source, before anything is copied.
		allowed, err := pc.IsRunningImageAllowed(ctx, image.UnparsedInstance(src, nil))
		if !allowed || err != nil {
			fail(1, "refused: %v", err)
		}
	case "copy":
		if fs.NArg() != 2 {
			fail(2, "copy: SRC DEST")
		}
		pc, err := signature.NewPolicyContext(&signature.Policy{
			Default: []signature.PolicyRequirement{signature.NewPRInsecureAcceptAnything()},
		})
		if err != nil {
			fail(2, "%v", err)
		}
		src, err := alltransports.ParseImageName(fs.Arg(0))
		if err != nil {
			fail(2, "%v", err)
		}
		dest, err := alltransports.ParseImageName(fs.Arg(1))
		if err != nil {
			fail(2, "%v", err)
		}
		opts := &copy.Options{SourceCtx: sys, DestinationCtx: sys}
		if *key != "" {
			pass, err := os.ReadFile(*passFile)
			if err != nil {
				fail(2, "%v", err)
			}
			opts.SignBySigstorePrivateKeyFile = *key
			// skopeo reads the first line of the passphrase file.
			opts.SignSigstorePrivateKeyPassphrase = []byte(strings.SplitN(string(pass), "\n", 2)[0])
		}
		if *identity != "" {
			named, err := reference.ParseNamed(*identity)
			if err != nil {
				fail(2, "%v", err)
			}
			opts.SignIdentity = named
		}
		if _, err := copy.Image(ctx, pc, dest, src, opts); err != nil {
			fail(2, "%v", err)
		}
	default:
		fail(2, "unknown command %q", os.Args[1])
	}
}
