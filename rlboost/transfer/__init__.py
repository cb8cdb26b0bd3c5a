"""Pull-based weight streaming: manifests, the publisher (trainer side) and the puller."""
