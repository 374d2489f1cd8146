"""Training-side code of edgecap: synthetic dataset, Keras models, training and export recipe."""
