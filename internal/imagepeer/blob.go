package imagepeer

import "io"

// WriteLayer writes the layer at dir as the tar stream nodes exchange,
// its sparse files as holes and data: the form a layer is also kept in
// the blob store (internal/imageblob).
func WriteLayer(out io.Writer, dir string) error { return writeLayer(out, dir, true) }

// UnpackLayer unpacks a stream WriteLayer wrote into dir, an existing
// empty directory, as a pull does (internal/layertar: nothing outside
// dir, no device but whiteouts, holes left unwritten).
func UnpackLayer(in io.Reader, dir string) error { return unpackLayer(in, dir) }
