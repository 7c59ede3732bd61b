"""MNIST's facts the rest of the code builds on: what an image is and how many classes there are.

Every module that needs an image's shape or the class count reads it here, so the
data layer owns them and nothing below training/ imports the model for them.
"""

IMAGE_SIDE = 28  # pixels; an image is IMAGE_SIDE x IMAGE_SIDE
IMAGE_SHAPE = (IMAGE_SIDE, IMAGE_SIDE, 1)  # height, width, one grayscale channel
NUM_CLASSES = 10  # the digits 0..9
