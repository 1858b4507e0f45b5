package template

// Spec is what a build makes: a base, steps in order, and the start and
// ready commands. It is the SDK's TemplateBuildStartV2 body; a Dockerfile
// is translated into one (ParseDockerfile).
type Spec struct {
	// Exactly one of FromImage and FromTemplate is set.
	FromImage         string        `json:"fromImage,omitempty"`
	FromTemplate      string        `json:"fromTemplate,omitempty"`
	FromImageRegistry *RegistryAuth `json:"fromImageRegistry,omitempty"`
	StartCmd          string        `json:"startCmd,omitempty"`
	ReadyCmd          string        `json:"readyCmd,omitempty"`
	// Force skips the layer cache for every step.
	Force bool   `json:"force,omitempty"`
	Steps []Step `json:"steps"`
}

// Step is one build step. Types and their Args:
//
//	COPY     [src, dest, user, mode]  src is a glob within the archive
//	         uploaded under FilesHash; user "" is the current user; mode
//	         "" keeps the files' modes, else octal like "0755".
//	RUN      [command] or [command, user]
//	WORKDIR  [path]
//	USER     [name]
//	ENV      [k1, v1, k2, v2, ...]
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args,omitempty"`
	FilesHash string   `json:"filesHash,omitempty"`
	// Force skips the layer cache for this step.
	Force bool `json:"force,omitempty"`
}

// RegistryAuth are the credentials for pulling FromImage.
type RegistryAuth struct {
	// Type is "registry" (Username, Password), "aws" or "gcp".
	Type               string `json:"type"`
	Username           string `json:"username,omitempty"`
	Password           string `json:"password,omitempty"`
	AwsAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AwsSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AwsRegion          string `json:"awsRegion,omitempty"`
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
}
